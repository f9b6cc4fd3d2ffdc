#include "self_check.h"

#include <gtest/gtest.h>

#include <cmath>

#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Config;
using testing::Synth;

Report Self(const std::string& dir) {
  auto r = RunSelfCheck(dir, {});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : Report{};
}

TEST(SelfCheck, Ds4530DividesByDpOnly) {
  Report r = Self(Synth("b", Config(2, 2, 2, "ds-4530", "local-mean")));
  ASSERT_EQ(r.self_params.size(), 14u);
  for (const auto& p : r.self_params) {
    EXPECT_NEAR(p.divisor, 2.0, 1e-4) << p.name;
    EXPECT_EQ(p.group, "sdp");
    EXPECT_EQ(p.group_size, 4);
    EXPECT_EQ(p.expected, 4.0);
    EXPECT_EQ(p.verdict, SelfVerdict::kWrongDivisor);
  }
  EXPECT_EQ(r.verdict, "wrong-divisor");
  EXPECT_EQ(r.ExitCode(), 1);
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_NE(r.groups[0].explanation.find("effective divisor 2.000 = dp for all 14 parameters"), std::string::npos)
      << r.groups[0].explanation;
  EXPECT_NE(r.groups[0].explanation.find("2.000 times the gradient"), std::string::npos) << r.groups[0].explanation;
}

TEST(SelfCheck, MeanDividesByGroupSize) {
  Report r = Self(Synth("b", Config(2, 2, 2, "mean", "local-mean")));
  ASSERT_EQ(r.self_params.size(), 14u);
  for (const auto& p : r.self_params) {
    EXPECT_NEAR(p.divisor, 4.0, 1e-4) << p.name;
    EXPECT_EQ(p.verdict, SelfVerdict::kOk);
  }
  EXPECT_EQ(r.verdict, "ok");
  EXPECT_EQ(r.ExitCode(), 0);
  EXPECT_NE(r.groups[0].explanation.find("= group size"), std::string::npos);
}

TEST(SelfCheck, Ds4530WithLossDividedBySpIsCorrect) {
  Report r = Self(Synth("b", Config(1, 4, 0, "ds-4530", "local-mean-div-sp")));
  for (const auto& p : r.self_params) {
    EXPECT_NEAR(p.divisor, 1.0, 1e-4) << p.name;  // dp = 1
    EXPECT_EQ(p.expected, 1.0);
    EXPECT_EQ(p.verdict, SelfVerdict::kOk);
  }
  EXPECT_EQ(r.ExitCode(), 0);
}

TEST(SelfCheck, SketchModeAlsoMeasuresTheDivisor) {
  auto spec = Config(2, 2, 2, "ds-4530", "local-mean");
  spec.capture = "sketch:64";
  Report r = Self(Synth("b", spec));
  ASSERT_EQ(r.self_params.size(), 14u);
  for (const auto& p : r.self_params) EXPECT_NEAR(p.divisor, 2.0, 1e-4) << p.name;
}

TEST(SelfCheck, NeedsPreAndPost) {
  auto spec = Config(2, 1, 0, "mean", "local-mean");
  spec.write_pre_post = false;
  auto r = RunSelfCheck(Synth("b", spec), {});
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("--self needs PRE_REDUCE and POST_REDUCE"), std::string::npos);
}

TEST(SelfCheck, ExpectedDivisorByLossRecipe) {
  pb::Config c;
  c.set_sp(4);
  c.set_dp(2);
  c.set_loss("local-mean");
  EXPECT_EQ(ExpectedDivisor(c, 8), 8);
  c.set_loss("token-weighted");
  EXPECT_EQ(ExpectedDivisor(c, 8), 2);
  c.set_loss("");
  EXPECT_EQ(ExpectedDivisor(c, 8), 8);
}

}  // namespace
}  // namespace gradtrace::diff
