// The two-set rules (semantics/factor_finding.h): a measured factor B/A, the two
// configurations and each side's reduction evidence -> a typed Finding. The
// words are diff/'s (tests/diff/explain_test.cc, cause_test.cc); these pin the
// rules with numbers.
#include "factor_finding.h"

#include <gtest/gtest.h>

#include <optional>
#include <string>

#include "candidates.h"
#include "cause.h"
#include "deepspeed_releases.h"
#include "predict.h"

namespace gradtrace::semantics {
namespace {

pb::Config Cfg(int dp, int sp, const std::string& scaling, const std::string& loss) {
  pb::Config c;
  c.set_dp(dp);
  c.set_sp(sp);
  c.set_world(dp * sp);
  c.set_scaling(scaling);
  c.set_loss(loss);
  c.set_gas(1);
  return c;
}

SideFacts Side(const pb::Config& c, const std::string& framework = "") {
  SideFacts s;
  s.config = c;
  s.deepspeed = CitesDeepSpeed("", framework, c);
  return s;
}

TEST(CauseNames, AreTheReportsJsonValues) {
  EXPECT_STREQ(CauseName(Cause::kNone), "none");
  EXPECT_STREQ(CauseName(Cause::kLossMultiplier), "loss-multiplier");
  EXPECT_STREQ(CauseName(Cause::kReductionDivisor), "reduction-divisor");
  EXPECT_STREQ(CauseName(Cause::kDoubleDivision), "double-division");
  EXPECT_STREQ(CauseName(Cause::kPredivide), "predivide");
  EXPECT_STREQ(CauseName(Cause::kLossyCompression), "lossy-compression");
  EXPECT_STREQ(CauseName(Cause::kIncompleteGroup), "incomplete-group");
  EXPECT_STREQ(CauseName(Cause::kTokenNormalisation), "token-normalisation");
  EXPECT_STREQ(CauseName(Cause::kPipelineScheduleScaling), "pp-schedule-scaling");
  EXPECT_STREQ(CauseName(Cause::kUnexplained), "unexplained");
}

TEST(Candidates, AtomsReciprocalsRatiosAndGasSquared) {
  pb::Config a = Cfg(1, 2, "mean", "local-mean"), b = Cfg(2, 4, "ds-4530", "local-mean");
  b.set_gas(4);
  const auto all = ScaleCandidates(a, b);
  ASSERT_FALSE(all.empty());
  EXPECT_EQ(all.front().expr, "1");
  const auto four = MatchFactor(4.0, all, 1e-6);
  ASSERT_FALSE(four.empty());
  EXPECT_EQ(four.front().expr, "sp(B)");  // sp before gas = 4, B before A
  const auto sixteenth = MatchFactor(1.0 / 16, all, 1e-6);
  ASSERT_EQ(sixteenth.size(), 1u);
  EXPECT_EQ(sixteenth.front().expr, "1/gas(B)^2");
  EXPECT_TRUE(sixteenth.front().squared);
  EXPECT_EQ(MatchFactor(2.0, all, 1e-6).front().expr, "dp(B)");  // sp(B)/sp(A) = 2 too, but a ratio is last
}

// DeepSpeed #5248 at sp = 4: a local-mean loss per shard, ZeRO-1/2 divides by dp only (PR #4530): the loss
// carries sp, and the fix is the recipe.
TEST(FactorFinding, Sp4LocalMeanUnderDs4530IsALossMultiplierInSp) {
  const Finding f = ExplainFactor(4.0, "dense", Side(Cfg(1, 1, "mean", "local-mean")),
                                  Side(Cfg(2, 4, "ds-4530", "local-mean")), 1e-4);
  EXPECT_EQ(f.cause, Cause::kLossMultiplier);
  EXPECT_EQ(f.dimension, semantics::Dimension::kSp);
  EXPECT_EQ(f.side, "B");
  EXPECT_EQ(f.expression, "sp(B)");
  ASSERT_TRUE(f.predicted.has_value());
  EXPECT_DOUBLE_EQ(*f.predicted, 4.0);
  EXPECT_FALSE(f.prediction_differs);
  EXPECT_DOUBLE_EQ(f.factor, 4.0);
  EXPECT_EQ(f.reading, Reading::kLocalMeanReducedByDp);
  EXPECT_EQ(f.fix, "backward(loss / sp) (local-mean-div-sp) or a loss weighted by the whole sequence's valid tokens");
  ASSERT_TRUE(f.change.has_value());
  EXPECT_EQ(*f.change, DeepSpeedChange::kPr4530);
  // The corrected recipe matches.
  const Finding ok = ExplainFactor(1.0, "dense", Side(Cfg(1, 1, "mean", "local-mean")),
                                   Side(Cfg(2, 4, "ds-4530", "local-mean-div-sp")), 1e-4);
  EXPECT_EQ(ok.cause, Cause::kNone);
  EXPECT_EQ(ok.expression, "1");
}

// The same factor in plain PyTorch: no DeepSpeed change is cited, and the reading says why without it.
TEST(FactorFinding, PlainPytorchLocalMeanCitesNoDeepSpeedChange) {
  const Finding f = ExplainFactor(2.0, "dense", Side(Cfg(1, 1, "mean", "local-mean"), "pytorch"),
                                  Side(Cfg(1, 2, "", "local-mean"), "pytorch"), 1e-4);
  EXPECT_EQ(f.cause, Cause::kLossMultiplier);
  EXPECT_EQ(f.dimension, semantics::Dimension::kSp);
  EXPECT_EQ(f.reading, Reading::kLocalMeanOverShard);
  EXPECT_FALSE(f.change.has_value());
  EXPECT_FALSE(f.predicted.has_value());  // no policy recorded: matched by candidates
}

// ZeRO-3 divides by dp only on its all-reduce path: that reading, not PR #4530.
TEST(FactorFinding, Zero3LocalMeanReadsAsTheAllreducePath) {
  pb::Config b = Cfg(1, 2, "deepspeed@0.19.8", "local-mean");
  b.set_zero_stage(3);
  const Finding f = ExplainFactor(2.0, "dense", Side(Cfg(1, 1, "mean", "local-mean")), Side(b), 1e-4);
  EXPECT_EQ(f.cause, Cause::kLossMultiplier);
  EXPECT_EQ(f.reading, Reading::kLocalMeanReducedByDpZero3);
  EXPECT_FALSE(f.change.has_value());
}

// DeepSpeed 0.12.6 ZeRO-2 with MoE at dp = sp = 2: expert buckets divided by edp / sp = 2, twice (PR #4957
// removed the second division in 0.13.1): 0.5 x, predicted from the release table; dense buckets 1.0.
TEST(FactorFinding, Pr4957MoeDoubleDivision) {
  pb::Config a = Cfg(2, 2, "deepspeed@0.13.1", "local-mean-div-sp");
  a.set_zero_stage(2);
  pb::Config b = a;
  b.set_scaling("deepspeed@0.12.6");
  const Finding f = ExplainFactor(0.5, "expert", Side(a), Side(b), 1e-4);
  EXPECT_EQ(f.cause, Cause::kDoubleDivision);
  EXPECT_EQ(f.dimension, semantics::Dimension::kDp);
  EXPECT_EQ(f.side, "B");
  EXPECT_EQ(f.param_kind, "expert");
  ASSERT_TRUE(f.predicted.has_value());
  EXPECT_DOUBLE_EQ(*f.predicted, 0.5);
  EXPECT_EQ(f.reading, Reading::kMoeBucketDividedTwice);
  EXPECT_DOUBLE_EQ(f.divisor_once, 2.0);
  ASSERT_TRUE(f.change.has_value());
  EXPECT_EQ(*f.change, DeepSpeedChange::kPr4957);
  EXPECT_EQ(DeepSpeedChangeOf(*f.change).first, "0.13.1");
  EXPECT_EQ(ExplainFactor(1.0, "dense", Side(a), Side(b), 1e-4).cause, Cause::kNone);
}

// PyTorch #155903 (HSDP): the reduce-scatter divides by the shard group (2) of a reduction over shard x
// replicate (4): 2 = replicate(B), a reduction divisor of B.
TEST(FactorFinding, HsdpReplicateIsTheReductionsDivisor) {
  pb::Config hsdp = Cfg(4, 1, "", "local-mean");
  hsdp.set_replicate(2);
  SideFacts b = Side(hsdp, "pytorch");
  b.reductions = {{"dense", 4, /*believed=*/2.0, /*expected=*/4.0}};
  const SideFacts a = Side(Cfg(1, 1, "", "mean"), "pytorch");
  const Finding f = ExplainFactor(2.0, "dense", a, b, 1e-4);
  EXPECT_EQ(f.cause, Cause::kReductionDivisor);
  EXPECT_EQ(f.dimension, semantics::Dimension::kReplicate);
  EXPECT_EQ(f.expression, "replicate(B)");
  EXPECT_EQ(f.side, "B");
  EXPECT_EQ(f.reading, Reading::kReplicateLeftOut);
  EXPECT_FALSE(f.change.has_value());
  // Without the replicate degree nothing in the configurations is 2.
  b.config.set_replicate(0);
  const Finding none = ExplainFactor(2.0, "dense", a, b, 1e-4);
  EXPECT_EQ(none.cause, Cause::kUnexplained);
  EXPECT_EQ(none.reading, Reading::kUnmatched);
}

// DeepSpeed #7749 (0.18.3's output hook, fixed in 0.18.4): 1/gas^2 at gas 4 is a double division by gas,
// cited from the change table for DeepSpeed traces only; 16 upward is not read as gas^2.
TEST(FactorFinding, GasSquaredCitesIssue7749) {
  pb::Config c = Cfg(2, 1, "", "local-mean");
  c.set_gas(4);
  const Finding f = ExplainFactor(1.0 / 16, "dense", Side(c, "deepspeed"), Side(c, "deepspeed"), 1e-4);
  EXPECT_EQ(f.cause, Cause::kDoubleDivision);
  EXPECT_EQ(f.dimension, semantics::Dimension::kGas);
  EXPECT_EQ(f.expression, "1/gas(B)^2");
  EXPECT_EQ(f.reading, Reading::kGasDividedTwice);
  ASSERT_TRUE(f.change.has_value());
  EXPECT_EQ(*f.change, DeepSpeedChange::kIssue7749);
  const DeepSpeedChangeRow& row = DeepSpeedChangeOf(*f.change);
  EXPECT_EQ(row.ref, "#7749");
  EXPECT_EQ(row.broken, "0.18.3");
  EXPECT_EQ(row.first, "0.18.4");
  EXPECT_FALSE(ExplainFactor(1.0 / 16, "dense", Side(c, "deepspeed"), Side(c, "pytorch"), 1e-4).change.has_value());
  EXPECT_EQ(ExplainFactor(16.0, "dense", Side(c, "deepspeed"), Side(c, "deepspeed"), 1e-4).cause, Cause::kUnexplained);
}

// Megatron-LM #673: B's reduction divides as its layout needs (declared 2 = expected 2), so a factor of cp = dp
// = 2 is a loss multiplier in cp; the recorded losses (2 x A's per replica) confirm it.
TEST(FactorFinding, EvidenceMakesCpALossMultiplierTheLossesConfirm) {
  pb::Config c = Cfg(2, 1, "", "token-weighted");
  c.set_cp(2);
  c.set_world(4);
  SideFacts a = Side(c, "pytorch"), b = Side(c, "pytorch");
  b.reductions = {{"dense", 4, 2.0, 2.0}};
  a.loss_per_replica = 1.5;
  b.loss_per_replica = 3.0;
  const Finding f = ExplainFactor(2.0, "dense", a, b, 1e-4);
  EXPECT_EQ(f.cause, Cause::kLossMultiplier);
  EXPECT_EQ(f.dimension, semantics::Dimension::kCp);
  EXPECT_EQ(f.expression, "cp(B)");
  EXPECT_EQ(f.reading, Reading::kLossTimesSplit);
  ASSERT_TRUE(f.loss_ratio.has_value());
  EXPECT_DOUBLE_EQ(*f.loss_ratio, 2.0);
  // A sum (believed 1 where 2 is needed) makes the same factor a reduction divisor.
  b.reductions = {{"dense", 4, 1.0, 2.0}};
  const Finding sum = ExplainFactor(2.0, "dense", a, b, 1e-4);
  EXPECT_EQ(sum.cause, Cause::kReductionDivisor);
  EXPECT_FALSE(sum.loss_ratio.has_value());
}

// Issue 41 (a LightningModule that sums its per-sample losses, 4 per micro-batch, dp 2 x gas 2 against one
// device): 4.000 matches no degree (dp 2, gas 2, world 2), but the recorded losses per replica differ by 4:
// a loss multiplier by a bare factor, named on the side whose loss is larger; unrecorded losses leave it
// unexplained, and losses that do not carry the factor do not make one up.
TEST(FactorFinding, RecordedLossesNameAFactorNoDegreeGives) {
  pb::Config one = Cfg(1, 1, "", "local-mean"), ddp = Cfg(2, 1, "mean", "local-mean");
  ddp.set_gas(2);
  SideFacts a = Side(one, "lightning"), b = Side(ddp, "pytorch-ddp");
  EXPECT_EQ(ExplainFactor(4.0, "dense", a, b, 1e-4).cause, Cause::kUnexplained);
  a.loss_per_replica = 0.8426;
  b.loss_per_replica = 4 * 0.8426;
  const Finding f = ExplainFactor(4.0, "dense", a, b, 1e-4);
  EXPECT_EQ(f.cause, Cause::kLossMultiplier);
  EXPECT_EQ(f.reading, Reading::kLossScaledOutsideLayout);
  EXPECT_EQ(f.side, "B");
  EXPECT_EQ(f.dimension, semantics::Dimension::kNone);
  EXPECT_EQ(f.expression, "");
  ASSERT_TRUE(f.loss_ratio.has_value());
  EXPECT_DOUBLE_EQ(*f.loss_ratio, 4.0);
  // The other way round: A's loss is the scaled one, B/A = 1/4.
  const Finding down = ExplainFactor(0.25, "dense", b, a, 1e-4);
  EXPECT_EQ(down.cause, Cause::kLossMultiplier);
  EXPECT_EQ(down.side, "A");
  EXPECT_DOUBLE_EQ(down.factor, 4.0);
  // Losses that do not carry the factor (a true unexplained 4.000) stay unexplained.
  b.loss_per_replica = 3 * 0.8426;
  EXPECT_EQ(ExplainFactor(4.0, "dense", a, b, 1e-4).cause, Cause::kUnexplained);
}

// DeepSpeed PR #5259: expert gradients averaged over edp (dp 4 / ep 2) are ep = 2 x too large; the PRs are
// cited for DeepSpeed traces.
TEST(FactorFinding, ExpertsAveragedOverEdpNameEp) {
  pb::Config c = Cfg(4, 1, "", "token-weighted");
  c.set_ep_size(2);
  c.set_edp(2);
  pb::Config mean = c;
  mean.set_scaling("mean");
  const Finding f = ExplainFactor(2.0, "expert", Side(c, "pytorch"), Side(mean, "pytorch"), 1e-4);
  EXPECT_EQ(f.cause, Cause::kReductionDivisor);
  EXPECT_EQ(f.dimension, semantics::Dimension::kEp);
  EXPECT_EQ(f.expression, "ep(B)");
  EXPECT_EQ(f.reading, Reading::kExpertsAveragedOverEdp);
  EXPECT_FALSE(f.change.has_value());
  const Finding ds = ExplainFactor(2.0, "expert", Side(c, "deepspeed"), Side(mean, "deepspeed"), 1e-4);
  ASSERT_TRUE(ds.change.has_value());
  EXPECT_EQ(*ds.change, DeepSpeedChange::kPrs5259And6546);
}

// local-mean-div-sp reduced with a plain mean over dp x sp: divided by sp twice (1/sp), a reduction divisor.
TEST(FactorFinding, LossDividedBySpAndAMeanOverSpIsSpTwice) {
  const Finding f = ExplainFactor(0.5, "dense", Side(Cfg(1, 1, "mean", "local-mean")),
                                  Side(Cfg(1, 2, "mean", "local-mean-div-sp")), 1e-4);
  EXPECT_EQ(f.cause, Cause::kReductionDivisor);
  EXPECT_EQ(f.dimension, semantics::Dimension::kSp);
  EXPECT_EQ(f.expression, "1/sp(B)");
  EXPECT_FALSE(f.Up());
  EXPECT_EQ(f.reading, Reading::kSpDividedTwice);
}

TEST(MismatchFinding, LossyCompressionThenIncompleteGroupThenTokens) {
  pb::Config c = Cfg(2, 2, "", "local-mean-div-sp");
  SideFacts a = Side(Cfg(1, 1, "", "mean")), b = Side(c);
  EXPECT_EQ(ExplainMismatch(a, b).cause, Cause::kUnexplained);
  EXPECT_EQ(ExplainMismatch(a, b).reading, Reading::kNotAMultiple);
  // Unequal valid-token counts per sp shard.
  b.valid_tokens_min = 22;
  b.valid_tokens_max = 24;
  Finding f = ExplainMismatch(a, b);
  EXPECT_EQ(f.cause, Cause::kTokenNormalisation);
  EXPECT_EQ(f.side, "B");
  EXPECT_EQ(f.dimension, semantics::Dimension::kSp);
  // Dense reductions over dp only (2 of dp x sp = 4 ranks): the sp ranks keep their own partial gradients.
  b.reductions = {{"dense", 2, 2.0, 2.0}};
  f = ExplainMismatch(a, b);
  EXPECT_EQ(f.cause, Cause::kIncompleteGroup);
  EXPECT_EQ(f.dimension, semantics::Dimension::kSp);
  // PowerSGD on A: an approximation, said first.
  a.config.set_comm_hook("powerSGD_hook");
  f = ExplainMismatch(a, b);
  EXPECT_EQ(f.cause, Cause::kLossyCompression);
  EXPECT_EQ(f.side, "A");
  EXPECT_TRUE(LossyCompression("PowerSGD"));
  EXPECT_FALSE(LossyCompression("bf16_compress_hook"));
}

TEST(FactorFinding, ExpertsAndDenseTogetherAreMixedOnlyWithoutAModelledPolicy) {
  EXPECT_EQ(ExplainedKind({"dense", "expert"}, Cfg(2, 1, "deepspeed@0.12.6", "local-mean")), "expert");
  EXPECT_EQ(ExplainedKind({"dense", "expert"}, Cfg(2, 1, "", "local-mean")), "mixed");
  EXPECT_EQ(ExplainedKind({"tp-shard"}, Cfg(2, 1, "", "local-mean")), "tp-shard");
  EXPECT_EQ(ExplainedKind({"dense", "replicated"}, Cfg(2, 1, "", "local-mean")), "dense");
}

TEST(FactorFinding, DeepSpeedIsCitedForItsProducerOrAPolicyThatModelsIt) {
  EXPECT_TRUE(CitesDeepSpeed("DeepSpeed 0.13.1 via adapter", "", Cfg(1, 1, "", "local-mean")));
  EXPECT_TRUE(CitesDeepSpeed("", "", Cfg(1, 1, "ds-4530", "local-mean")));
  EXPECT_TRUE(CitesDeepSpeed("", "", Cfg(1, 1, "deepspeed@0.12.6", "local-mean")));
  EXPECT_FALSE(CitesDeepSpeed("gradtrace-train", "pytorch", Cfg(1, 1, "mean", "local-mean")));
}

// A pipelined side (format 1.5): 2 stages x dp 2, 4 micro-batches, a mean loss per micro-batch.
pb::Config Pipelined(std::optional<bool> scale_grads) {
  pb::Config c = Cfg(2, 1, "", "local-mean");
  c.set_pp(2);
  c.set_world(4);
  c.set_pp_stages(2);
  c.set_pp_microbatches(4);
  c.set_pp_schedule("ScheduleGPipe");
  if (scale_grads) c.set_pp_scale_grads(*scale_grads);
  return c;
}

TEST(PipelineMultiple, ScaleGradsMatchesAMeanLossPerMicroBatch) {
  EXPECT_EQ(PipelineMultiple(Cfg(1, 1, "", "local-mean")), 1.0);  // not pipelined
  EXPECT_EQ(PipelineMultiple(Pipelined(true)), 1.0);
  EXPECT_EQ(PipelineMultiple(Pipelined(false)), 4.0);
  EXPECT_EQ(PipelineMultiple(Pipelined(true), /*loss_divided_by_n=*/true), 0.25);
  EXPECT_EQ(PipelineMultiple(Pipelined(false), true), 1.0);
  EXPECT_FALSE(PipelineMultiple(Pipelined(std::nullopt)).has_value());
}

TEST(FactorFinding, UnscaledScheduleIsNMicroBatchesOnTheSideThatCarriesIt) {
  const SideFacts ref = Side(Cfg(1, 1, "", "local-mean"));
  // B: scale_grads=False, 4x: the schedule's scaling, with B's prediction.
  Finding f = ExplainFactor(4.0, "dense", ref, Side(Pipelined(false)), 1e-3);
  EXPECT_EQ(f.cause, Cause::kPipelineScheduleScaling);
  EXPECT_EQ(f.reading, Reading::kPipelineSchedule);
  EXPECT_EQ(f.side, "B");
  EXPECT_EQ(f.dimension, semantics::Dimension::kPpMicrobatches);
  EXPECT_EQ(f.expression, "pp_microbatches(B)");
  ASSERT_TRUE(f.predicted.has_value());
  EXPECT_DOUBLE_EQ(*f.predicted, 4.0);
  EXPECT_FALSE(f.prediction_differs);
  EXPECT_NE(f.fix.find("scale_grads=True"), std::string::npos);
  // The same run as A: 1/4 read in A's direction.
  f = ExplainFactor(0.25, "dense", Side(Pipelined(false)), ref, 1e-3);
  EXPECT_EQ(f.cause, Cause::kPipelineScheduleScaling);
  EXPECT_EQ(f.side, "A");
  EXPECT_DOUBLE_EQ(f.factor, 4.0);
  // scale_grads not recorded: the factor alone names it, with no prediction.
  f = ExplainFactor(4.0, "dense", ref, Side(Pipelined(std::nullopt)), 1e-3);
  EXPECT_EQ(f.cause, Cause::kPipelineScheduleScaling);
  EXPECT_FALSE(f.predicted.has_value());
}

TEST(FactorFinding, ScaledScheduleWithALossAlreadyDividedIsOneOverN) {
  const SideFacts ref = Side(Cfg(1, 1, "", "local-mean"));
  Finding f = ExplainFactor(0.25, "dense", ref, Side(Pipelined(true)), 1e-3);
  EXPECT_EQ(f.cause, Cause::kPipelineScheduleScaling);
  EXPECT_FALSE(f.Up());
  EXPECT_NE(f.fix.find("not both"), std::string::npos);
  // A scaling schedule cannot make 4x (the loss is multiplied elsewhere): not the schedule's cause.
  f = ExplainFactor(4.0, "dense", ref, Side(Pipelined(true)), 1e-3);
  EXPECT_NE(f.cause, Cause::kPipelineScheduleScaling);
  // A factor that is not the micro-batch count is not the schedule's.
  f = ExplainFactor(2.0, "dense", ref, Side(Pipelined(false)), 1e-3);
  EXPECT_NE(f.cause, Cause::kPipelineScheduleScaling);
}

}  // namespace
}  // namespace gradtrace::semantics
