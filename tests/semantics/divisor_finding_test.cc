// The --self rules (semantics/divisor_finding.h): an effective divisor measured
// over a group, against the layout's expressions -> a typed DivisorFinding.
// The words are diff/evidence/self_check.cc's (tests/diff/self_check_test.cc).
#include "divisor_finding.h"

#include <gtest/gtest.h>

#include <string>

#include "cause.h"
#include "deepspeed_releases.h"

namespace gradtrace::semantics {
namespace {

pb::Config Cfg(int dp, int sp, const std::string& loss) {
  pb::Config c;
  c.set_dp(dp);
  c.set_sp(sp);
  c.set_world(dp * sp);
  c.set_loss(loss);
  c.set_gas(1);
  return c;
}

MeasuredDivisor Measured(double divisor, int group_size, double expected, const std::string& group = "sdp",
                         const std::string& kind = "dense") {
  MeasuredDivisor m;
  m.divisor = divisor;
  m.group_size = group_size;
  m.expected = expected;
  m.group = group;
  m.param_kind = kind;
  return m;
}

// DeepSpeed #5248 at dp 2 x sp 2: ZeRO-1/2 divides the sum over 4 ranks by 4 / sp = 2 (PR #4530) where a
// local-mean loss needs 4: dp only, the optimizer sees 2 x the gradient.
TEST(DivisorFinding, GroupOverSpIsDpOnly) {
  const DivisorFinding f = ExplainDivisor(Measured(2, 4, 4), Cfg(2, 2, "local-mean"), /*deepspeed=*/true, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kDpOnlyOverSp);
  EXPECT_EQ(f.expression, "dp");
  EXPECT_EQ(f.cause, Cause::kReductionDivisor);
  EXPECT_EQ(f.dimension, semantics::Dimension::kSp);
  EXPECT_FALSE(f.right);
  EXPECT_DOUBLE_EQ(f.multiple, 2.0);
  ASSERT_TRUE(f.change.has_value());
  EXPECT_EQ(*f.change, DeepSpeedChange::kPr4530);
  EXPECT_FALSE(ExplainDivisor(Measured(2, 4, 4), Cfg(2, 2, "local-mean"), false, 1e-3).change.has_value());
  // With loss / sp the same divisor is what the layout needs.
  const DivisorFinding right = ExplainDivisor(Measured(2, 4, 2), Cfg(2, 2, "local-mean-div-sp"), true, 1e-3);
  EXPECT_EQ(right.cause, Cause::kNone);
  EXPECT_TRUE(right.right);
  EXPECT_EQ(right.dimension, semantics::Dimension::kNone);
}

TEST(DivisorFinding, GroupMean) {
  const DivisorFinding ok = ExplainDivisor(Measured(4, 4, 4), Cfg(2, 2, "local-mean"), false, 1e-3);
  EXPECT_EQ(ok.rule, DivisorRule::kGroupMean);
  EXPECT_EQ(ok.expression, "group size");
  EXPECT_EQ(ok.cause, Cause::kNone);
  // Where loss / sp needs 2: the mean divides by sp once more.
  const DivisorFinding off = ExplainDivisor(Measured(4, 4, 2), Cfg(2, 2, "local-mean-div-sp"), false, 1e-3);
  EXPECT_EQ(off.cause, Cause::kReductionDivisor);
  EXPECT_EQ(off.dimension, semantics::Dimension::kSp);
  EXPECT_DOUBLE_EQ(off.multiple, 0.5);
}

// The MoE double division (DeepSpeed before PR #4957): dp 4 x sp 2, a group of 8 divided by 8 / 2 twice = 16.
TEST(DivisorFinding, GroupOverSpSquaredIsTheDoubleDivision) {
  const DivisorFinding f = ExplainDivisor(Measured(16, 8, 4), Cfg(4, 2, "local-mean-div-sp"), true, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kDividedTwice);
  EXPECT_EQ(f.expression, "(group size / sp)^2");
  EXPECT_EQ(f.cause, Cause::kDoubleDivision);
  EXPECT_EQ(f.dimension, semantics::Dimension::kDp);
  ASSERT_TRUE(f.change.has_value());
  EXPECT_EQ(*f.change, DeepSpeedChange::kPr4957);
  // dp 2 x sp 2: 4 x sp = 8 is the group size x sp.
  const DivisorFinding x = ExplainDivisor(Measured(8, 4, 2), Cfg(2, 2, "local-mean-div-sp"), false, 1e-3);
  EXPECT_EQ(x.expression, "group size x sp");
  EXPECT_EQ(x.cause, Cause::kDoubleDivision);
  EXPECT_FALSE(x.change.has_value());
  // At sp 1 the same numbers are no double division.
  EXPECT_EQ(ExplainDivisor(Measured(8, 4, 4), Cfg(4, 1, "local-mean"), false, 1e-3).cause, Cause::kUnexplained);
}

// PyTorch #155903: HSDP, dp 4 = replicate 2 x shard 2, POST_REDUCE summed over the replicas and divided by the
// shard group's 2 where 4 is needed.
TEST(DivisorFinding, HsdpShardGroupOnlyLeavesOutReplicate) {
  pb::Config c = Cfg(4, 1, "local-mean");
  c.set_replicate(2);
  const DivisorFinding f = ExplainDivisor(Measured(2, 4, 4, "shard"), c, false, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kShardOnly);
  EXPECT_EQ(f.expression, "group size / replicate");
  EXPECT_EQ(f.cause, Cause::kReductionDivisor);
  EXPECT_EQ(f.dimension, semantics::Dimension::kReplicate);
  EXPECT_TRUE(f.with_replicas);
  EXPECT_TRUE(SumsOverReplicas(c, "shard"));
  EXPECT_FALSE(SumsOverReplicas(c, "replicate"));
  EXPECT_FALSE(SumsOverReplicas(Cfg(4, 1, "local-mean"), "shard"));
}

// Expert gradients averaged over their edp group of 2 where dp = 4 is needed (DeepSpeed PRs #5259/#6546).
TEST(DivisorFinding, ExpertsOverEdp) {
  const DivisorFinding f = ExplainDivisor(Measured(2, 2, 4, "edp", "expert"), Cfg(4, 1, "token-weighted"), true, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kExpertsOverEdp);
  EXPECT_EQ(f.expression, "edp group size");
  EXPECT_EQ(f.dimension, semantics::Dimension::kEp);
  EXPECT_EQ(f.cause, Cause::kReductionDivisor);
  EXPECT_DOUBLE_EQ(f.multiple, 2.0);
  ASSERT_TRUE(f.change.has_value());
  EXPECT_EQ(*f.change, DeepSpeedChange::kPrs5259And6546);
  const DivisorFinding ok = ExplainDivisor(Measured(4, 2, 4, "edp", "expert"), Cfg(4, 1, "token-weighted"), true, 1e-3);
  EXPECT_EQ(ok.rule, DivisorRule::kExpertsByDp);
  EXPECT_EQ(ok.expression, "dp");
  EXPECT_EQ(ok.cause, Cause::kNone);
}

// A model-parallel group (a norm replicated on the tp ranks): partial sums need 1, identical copies the group size.
TEST(DivisorFinding, ModelParallelPartialSumsAndCopies) {
  MeasuredDivisor m = Measured(1, 2, 1, "tp", "replicated");
  m.model_parallel = true;
  EXPECT_EQ(ExplainDivisor(m, Cfg(2, 1, "local-mean"), false, 1e-3).rule, DivisorRule::kPartialSumsAdded);
  m.divisor = 2;
  DivisorFinding f = ExplainDivisor(m, Cfg(2, 1, "local-mean"), false, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kPartialSumsAveraged);
  EXPECT_EQ(f.dimension, semantics::Dimension::kTp);
  EXPECT_EQ(f.cause, Cause::kReductionDivisor);
  m.identical_inputs = true;
  m.divisor = 1;
  m.expected = 2;
  f = ExplainDivisor(m, Cfg(2, 1, "local-mean"), false, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kCopiesAdded);
  EXPECT_EQ(f.expression, "1");
  EXPECT_EQ(f.dimension, semantics::Dimension::kTp);
}

TEST(DivisorFinding, SumGasAndNothing) {
  DivisorFinding f = ExplainDivisor(Measured(1, 4, 4), Cfg(4, 1, "local-mean"), false, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kSum);
  EXPECT_EQ(f.dimension, semantics::Dimension::kWorld);
  pb::Config gas = Cfg(4, 1, "local-mean");
  gas.set_gas(4);
  f = ExplainDivisor(Measured(16, 4, 4), gas, false, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kAlsoGas);
  EXPECT_EQ(f.expression, "group size x gas");
  EXPECT_EQ(f.dimension, semantics::Dimension::kGas);
  f = ExplainDivisor(Measured(3.3, 4, 4), Cfg(4, 1, "local-mean"), false, 1e-3);
  EXPECT_EQ(f.rule, DivisorRule::kUnmatched);
  EXPECT_EQ(f.expression, "");
  EXPECT_EQ(f.cause, Cause::kUnexplained);
  // A divisor no rule names but the layout needs is right.
  EXPECT_EQ(ExplainDivisor(Measured(3.3, 4, 3.3), Cfg(4, 1, "local-mean"), false, 1e-3).cause, Cause::kNone);
}

TEST(DivisorFinding, InconsistentReductionsAreLossyCompressionOnlyWithALossyHook) {
  pb::Config c = Cfg(2, 1, "local-mean");
  EXPECT_EQ(InconsistentReductionCause(c), Cause::kUnexplained);
  c.set_comm_hook("powerSGD_hook");
  EXPECT_EQ(InconsistentReductionCause(c), Cause::kLossyCompression);
}

}  // namespace
}  // namespace gradtrace::semantics
