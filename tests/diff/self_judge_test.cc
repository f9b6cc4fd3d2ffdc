// The one judging function of --self and the live guard (explain/self_judge.h), on measurements given
// directly: what the guard hands over through the binding.
#include "explain/self_judge.h"

#include <gtest/gtest.h>

#include <cmath>

#include "report/violations.h"

namespace gradtrace::diff {
namespace {

// dp 2, mean scaling, a local-mean loss: every dense gradient must be divided by 2.
pb::RunInfo Dp2() {
  pb::RunInfo run;
  run.mutable_config()->set_world(2);
  run.mutable_config()->set_dp(2);
  run.mutable_config()->set_scaling("mean");
  run.mutable_config()->set_loss("local-mean");
  for (const char* name : {"a.weight", "b.weight"}) {
    pb::ParamInfo* p = run.add_params();
    p->set_name(name);
    p->set_numel(16);
    p->set_dtype(pb::FP32);
    p->set_grad_group("dp");
    p->set_kind(pb::DENSE);
  }
  return run;
}

// POST = S / d at 16 elements of S = 1..16.
ReductionSums Divided(double d) {
  ReductionSums s;
  for (int i = 1; i <= 16; ++i) {
    s.ss += i * i;
    s.sp += i * (i / d);
    s.pp += (i / d) * (i / d);
  }
  s.compared = 16;
  s.group = "dp";
  s.group_size = 2;
  s.buckets = {0};
  return s;
}

Report Judge(const SelfMeasurements& m) {
  const pb::RunInfo run = Dp2();
  Report r = SelfReportHead(run, 2, std::nullopt);
  r.step = 0;
  JudgeSelf(run, m, &r);
  return r;
}

TEST(SelfJudge, TheRightDivisorIsOk) {
  SelfMeasurements m;
  m.reductions[{0, "dp"}] = Divided(2);
  m.reductions[{1, "dp"}] = Divided(2);
  const Report r = Judge(m);
  EXPECT_EQ(r.verdict, "ok");
  ASSERT_EQ(r.self_params.size(), 2u);
  EXPECT_NEAR(r.self_params[0].divisor, 2.0, 1e-12);
  EXPECT_EQ(r.self_params[0].expected, 2.0);
}

TEST(SelfJudge, ASumIsAWrongDivisorWithItsCause) {
  SelfMeasurements m;
  m.reductions[{0, "dp"}] = Divided(1);
  m.reductions[{1, "dp"}] = Divided(1);
  const Report r = Judge(m);
  EXPECT_EQ(r.verdict, "wrong-divisor");
  ASSERT_EQ(r.groups.size(), 1u);
  EXPECT_NEAR(*r.groups[0].scale, 1.0, 1e-12);
  EXPECT_EQ(r.groups[0].count, 2);
  ASSERT_TRUE(r.groups[0].cause.has_value());
  EXPECT_EQ(semantics::CauseName(*r.groups[0].cause), std::string("reduction-divisor"));
  EXPECT_NE(r.groups[0].explanation.find("which needs 2.000"), std::string::npos) << r.groups[0].explanation;
}

TEST(SelfJudge, NanAmongTheValuesIsMissingNotOk) {
  SelfMeasurements m;
  m.reductions[{0, "dp"}] = Divided(2);
  m.reductions[{0, "dp"}].sp = std::nan("");
  const Report r = Judge(m);
  EXPECT_EQ(r.verdict, "missing");
  bool said = false;
  for (const Finding& f : r.findings) said |= f.message.find("NaN or Inf among its reduction") != std::string::npos;
  EXPECT_TRUE(said);
}

TEST(SelfJudge, ReplicasNonfiniteAndSkippedAreFindings) {
  SelfMeasurements m;
  m.reductions[{0, "dp"}] = Divided(2);
  m.replicas[1] = {0.5, 0, 1};
  m.replicas[0] = {1e-9, 0, 1};  // within rtol: no finding
  NonfiniteRecord nan;
  nan.rank = 1;
  nan.phase = "PRE_REDUCE";
  nan.bucket = 3;
  nan.group = "dp";
  nan.params = {0, 1};
  m.nonfinite.push_back(nan);
  m.skipped = {1};
  const Report r = Judge(m);
  EXPECT_EQ(r.verdict, "inconsistent");
  std::vector<std::string> kinds;
  for (const Finding& f : r.findings) kinds.push_back(f.kind + ": " + f.message);
  auto has = [&](const std::string& text) {
    for (const auto& k : kinds)
      if (k.find(text) != std::string::npos) return true;
    return false;
  };
  EXPECT_TRUE(has("replica: replicas of 'b.weight' disagree in FINAL (rank 0 vs rank 1, relative difference 0.5"));
  EXPECT_FALSE(has("replicas of 'a.weight'"));
  EXPECT_TRUE(
      has("nonfinite: NaN or Inf in PRE_REDUCE of bucket 3 (group dp, micro-step 0) on rank 1: 'a.weight', "
          "'b.weight'"));
  EXPECT_TRUE(has("skipped: rank 1 did not step the optimizer in step 0"));
}

TEST(SelfJudge, AMisreportedNormIsAFindingNotAVerdict) {
  SelfMeasurements m;
  m.reductions[{0, "dp"}] = Divided(2);
  m.reported_norm = 2.0;
  m.final_norm = 1.0;
  const Report r = Judge(m);
  EXPECT_EQ(r.verdict, "ok");
  ASSERT_TRUE(r.grad_norm.has_value());
  EXPECT_EQ(r.grad_norm->verdict, "misreported");
}

// The guard's reading of a judged step (report/violations.h), shared by the Python guard and gradtrace-train's.
TEST(SelfJudge, ViolationsAreTheBadGroupsThenTheFindings) {
  SelfMeasurements m;
  m.reductions[{0, "dp"}] = Divided(1);
  m.reductions[{0, "dp"}].buckets = {3, 1};
  m.reductions[{1, "dp"}] = Divided(1);
  m.skipped = {1};
  const Report r = Judge(m);
  const std::vector<Violation> found = SelfViolations(r);
  ASSERT_EQ(found.size(), 2u);
  EXPECT_EQ(found[0].check, "divisor");
  EXPECT_EQ(found[0].cause, "reduction-divisor");
  EXPECT_EQ(found[0].message, r.groups[0].explanation);
  EXPECT_EQ(found[0].params, (std::vector<std::string>{"a.weight", "b.weight"}));
  EXPECT_EQ(found[0].buckets, (std::vector<int32_t>{0, 1, 3}));
  EXPECT_NEAR(*found[0].divisor, 1.0, 1e-12);
  EXPECT_EQ(found[1].check, "skipped-step");
  EXPECT_EQ(ViolationLine(2, 7, found[0]),
            "gradtrace guard: rank 2: step 7: buckets 0, 1, 3 (2 parameters): " + r.groups[0].explanation);
  EXPECT_EQ(ViolationLine(0, 0, found[1]), "gradtrace guard: rank 0: step 0: " + found[1].message);
}

TEST(SelfJudge, ARightDivisorIsNoViolationAndLinesAreTerminalSafe) {
  SelfMeasurements m;
  m.reductions[{0, "dp"}] = Divided(2);
  EXPECT_TRUE(SelfViolations(Judge(m)).empty());
  Violation v;
  v.message = "name \x1b[31mred\nnext";
  v.params = {"x"};
  v.buckets = {0, 1, 2, 3, 4, 5, 6};
  const std::string line = ViolationLine(1, 2, v);
  EXPECT_EQ(line.find('\x1b'), std::string::npos) << line;
  EXPECT_EQ(line.find('\n'), std::string::npos) << line;
  EXPECT_NE(line.find("buckets 0, 1, 2, 3, 4, 5 ... (1 parameter): "), std::string::npos) << line;
}

TEST(SelfJudge, ReferenceViolationsAreTheGroupsThatDoNotMatch) {
  Report against;
  against.params.resize(2);
  against.params[0].name = "a.weight";
  against.params[0].verdict = Verdict::kScaled;
  against.params[1].name = "b.weight";
  against.params[1].verdict = Verdict::kMatch;
  against.groups.resize(2);
  against.groups[0].params = {"a.weight"};
  against.groups[0].explanation = "B/A = 2.000";
  against.groups[1].params = {"b.weight"};
  const std::vector<Violation> found = ReferenceViolations(against);
  ASSERT_EQ(found.size(), 1u);
  EXPECT_EQ(found[0].check, "reference");
  EXPECT_EQ(found[0].message, "against the reference run (A): B/A = 2.000");
  EXPECT_EQ(found[0].params, (std::vector<std::string>{"a.weight"}));
}

}  // namespace
}  // namespace gradtrace::diff
