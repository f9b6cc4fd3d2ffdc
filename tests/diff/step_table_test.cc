// --step all (issue 12): one comparison per common step, a row each.
#include "compare/step_table.h"

#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Config;
using testing::Synth;

testing::SynthSpec Steps(testing::SynthSpec spec, int steps) {
  spec.steps = steps;
  return spec;
}

TEST(StepTable, EveryCommonStepGetsARowWithItsOwnFactor) {
  const std::string a = Synth("ref", Steps(testing::Reference(), 3));
  const std::string b = Synth("sp2", Steps(Config(1, 2, 2, "ds-4530", "local-mean"), 4));
  auto t = RunDiffAllSteps(a, b, {});
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(3u, t->steps.size());  // B's step 3 has no counterpart in A
  for (int64_t s = 0; s < 3; ++s) {
    const Report& r = t->steps[s];
    EXPECT_EQ(s, r.step);
    EXPECT_EQ("scaled", r.verdict);
    ASSERT_EQ(1u, r.groups.size());
    EXPECT_NEAR(2.0, *r.groups[0].scale, 1e-6);
    EXPECT_EQ(14, r.groups[0].count);
  }
  EXPECT_EQ("scaled", t->verdict);
  EXPECT_EQ(1, t->ExitCode());
  ASSERT_NE(nullptr, t->FirstDifference());
  EXPECT_EQ(0, t->FirstDifference()->step);
  EXPECT_EQ(0u, t->summary.find("3 of 3 steps differ, the first at step 0: B/A = 2.000")) << t->summary;

  const auto j = nlohmann::json::parse(RenderStepTableJson(*t));
  EXPECT_EQ("steps", j["mode"]);
  EXPECT_EQ(1, j["exit_code"]);
  ASSERT_EQ(3u, j["steps"].size());
  EXPECT_EQ(2, j["steps"][2]["step"]);
  EXPECT_NEAR(2.0, j["steps"][2]["groups"][0]["scale"].get<double>(), 1e-6);
  const std::string md = RenderStepTableMarkdown(*t);
  EXPECT_NE(std::string::npos, md.find("|      2 | scaled")) << md;
}

// --step all --html: the bucket views of the step the HTML draws (the first that differs), no other's.
TEST(StepTable, BucketViewsOfTheShownStepOnly) {
  const std::string a = Synth("ref", Steps(testing::Reference(), 3));
  auto spec = Steps(Config(1, 2, 2, "ds-4530", "local-mean"), 3);
  DiffOptions o;
  o.bucket_view = true;
  auto t = RunDiffAllSteps(a, Synth("sp2", spec), o);
  ASSERT_TRUE(t.ok()) << t.status().message();
  ASSERT_EQ(3u, t->steps.size());
  EXPECT_EQ(&t->Shown(), t->FirstDifference());
  for (const Report& r : t->steps) {
    const bool shown = &r == &t->Shown();
    EXPECT_EQ(shown, !r.a.bucket_view.empty()) << "step " << r.step;
    EXPECT_EQ(shown, !r.b.bucket_view.empty()) << "step " << r.step;
  }
  for (const BucketCell& c : t->Shown().b.bucket_view) {
    EXPECT_NEAR(c.divisor, 1.0, 1e-4);  // sp 2, ds-4530: group 2 / sp 2, where 2 is needed
    EXPECT_EQ(c.expected, 2.0);
  }
}

TEST(StepTable, IdenticalRunsMatchAtEveryStep) {
  const std::string a = Synth("a", Steps(testing::Reference(), 3));
  auto t = RunDiffAllSteps(a, a, {});
  ASSERT_TRUE(t.ok()) << t.status().message();
  EXPECT_EQ(3u, t->steps.size());
  EXPECT_EQ("match", t->verdict);
  EXPECT_EQ(0, t->ExitCode());
  EXPECT_EQ(nullptr, t->FirstDifference());
  EXPECT_EQ("all 3 steps match", t->summary);
}

TEST(StepTable, PhaseWithoutCommonStepsIsAnError) {
  auto spec = Steps(testing::Reference(), 2);
  spec.write_pre_post = false;
  const std::string a = Synth("a", spec);
  DiffOptions o;
  o.phase = pb::PRE_REDUCE;
  auto t = RunDiffAllSteps(a, a, o);
  ASSERT_FALSE(t.ok());
  EXPECT_EQ(Status::Code::kInvalidArgument, t.status().code());
  EXPECT_NE(std::string::npos, t.status().message().find("shares no pre step")) << t.status().message();
}

}  // namespace
}  // namespace gradtrace::diff
