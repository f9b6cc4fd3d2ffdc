// The two-set rules (semantics/factor_finding.h): a measured factor B/A, the two
// configurations and each side's reduction evidence -> a typed Finding. The
// words are diff/'s (tests/diff/explain_test.cc, cause_test.cc); these pin the
// rules with numbers.
#include "factor_finding.h"

#include <gtest/gtest.h>

#include <algorithm>
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
// = 2 is a loss multiple, never a divisor: the evidence rules both divisors out. Which loss multiple, x cp (the
// bug) or x dp, the traces cannot tell (issue 41): both are left, and a rerun with dp 4 separates them.
TEST(FactorFinding, EvidenceMakesCpALossMultiplierTheLossesConfirm) {
  pb::Config c = Cfg(2, 1, "", "token-weighted");
  c.set_cp(2);
  c.set_world(4);
  SideFacts a = Side(c, "pytorch"), b = Side(c, "pytorch");
  b.reductions = {{"dense", 4, 2.0, 2.0}};
  a.loss_per_replica = 1.5;
  b.loss_per_replica = 3.0;
  const Finding f = ExplainFactor(2.0, "dense", a, b, 1e-4);
  EXPECT_EQ(f.cause, Cause::kAmbiguous);
  ASSERT_EQ(f.alternatives.size(), 4u);
  for (const auto& alt : f.alternatives) {
    EXPECT_EQ(alt.side, "B");
    EXPECT_EQ(alt.ruled_out, alt.cause == Cause::kReductionDivisor ? RuledOut::kReductionsAsNeeded : RuledOut::kNo);
  }
  EXPECT_EQ(f.rerun, semantics::Dimension::kDp);
  EXPECT_EQ(f.rerun_side, "B");
  EXPECT_EQ(f.rerun_value, 4);
  for (const auto& alt : f.alternatives) {
    if (alt.ruled_out != RuledOut::kNo) continue;
    ASSERT_TRUE(alt.rerun_factor.has_value());
    EXPECT_DOUBLE_EQ(*alt.rerun_factor, alt.dimension == semantics::Dimension::kDp ? 4.0 : 2.0);
  }
  // With cp 2 and dp 4 only cp gives the factor: a loss multiplier in cp, which the recorded losses confirm.
  c.set_dp(4);
  c.set_world(8);
  a.config = b.config = c;
  b.reductions = {{"dense", 8, 4.0, 4.0}};
  const Finding one = ExplainFactor(2.0, "dense", a, b, 1e-4);
  EXPECT_EQ(one.cause, Cause::kLossMultiplier);
  EXPECT_EQ(one.dimension, semantics::Dimension::kCp);
  EXPECT_EQ(one.expression, "cp(B)");
  EXPECT_EQ(one.reading, Reading::kLossTimesSplit);
  ASSERT_TRUE(one.loss_ratio.has_value());
  EXPECT_DOUBLE_EQ(*one.loss_ratio, 2.0);
  ASSERT_EQ(one.alternatives.size(), 2u);  // cp as a loss multiple (left) and as a divisor (ruled out)
  EXPECT_EQ(one.alternatives[1].ruled_out, RuledOut::kReductionsAsNeeded);
  c.set_dp(2);
  c.set_world(4);
  a.config = b.config = c;
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

// Issue 41: the causes a factor fits are all reported when several fit. dp = gas = 2 with B's reductions right
// (the accelerate + DeepSpeed report: a loss x the number of processes): the divisor in dp is ruled out, the
// loss x dp and the loss not divided by gas are left; a rerun with gas 4 separates them (gas 4.000, dp 2.000).
TEST(FactorFinding, DpEqualToGasIsAmbiguousWithARerun) {
  pb::Config ref = Cfg(1, 1, "mean", "local-mean"), b = Cfg(2, 1, "mean", "local-mean");
  b.set_gas(2);
  SideFacts sb = Side(b);
  sb.reductions = {{"dense", 2, 2.0, 2.0}};
  const Finding f = ExplainFactor(2.0, "dense", Side(ref), sb, 1e-4);
  EXPECT_EQ(f.cause, Cause::kAmbiguous);
  EXPECT_EQ(f.reading, Reading::kAmbiguous);
  std::vector<std::string> left, out;
  for (const auto& alt : f.alternatives) {
    (alt.ruled_out == RuledOut::kNo ? left : out).push_back(alt.expression + " " + CauseName(alt.cause));
  }
  EXPECT_EQ(left, (std::vector<std::string>{"dp(B) loss-multiplier", "gas(B) loss-multiplier"}));
  EXPECT_EQ(out, (std::vector<std::string>{"dp(B) reduction-divisor"}));
  EXPECT_EQ(f.rerun, semantics::Dimension::kGas);
  EXPECT_EQ(f.rerun_value, 4);
  for (const auto& alt : f.alternatives) {
    if (alt.ruled_out == RuledOut::kNo) {
      EXPECT_DOUBLE_EQ(*alt.rerun_factor, alt.dimension == Dimension::kGas ? 4 : 2);
    }
  }
  // Without reductions in the traces (FINAL only) the divisor in dp is left too.
  const Finding bare = ExplainFactor(2.0, "dense", Side(ref), Side(b), 1e-4);
  EXPECT_EQ(bare.cause, Cause::kAmbiguous);
  EXPECT_EQ(std::count_if(bare.alternatives.begin(), bare.alternatives.end(),
                          [](const Finding& x) { return x.ruled_out == RuledOut::kNo; }),
            3);
  // B's reductions summing without the mean carry the whole factor: a divisor in dp, the loss multiples ruled out.
  sb.reductions = {{"dense", 2, 1.0, 2.0}};
  const Finding sum = ExplainFactor(2.0, "dense", Side(ref), sb, 1e-4);
  EXPECT_EQ(sum.cause, Cause::kReductionDivisor);
  EXPECT_EQ(sum.dimension, Dimension::kDp);
  for (const auto& alt : sum.alternatives) {
    EXPECT_EQ(alt.ruled_out, alt.cause == Cause::kLossMultiplier ? RuledOut::kReductionsCarryFactor : RuledOut::kNo);
  }
}

// sp = gas = 2: a token-weighted loss over sp shards does not over-count by itself, so sp x the loss and the loss
// not divided by gas are both left; a local-mean recipe over the shards gives the factor by itself, which
// rules the gas candidate out (the #5248 reading stays the one).
TEST(FactorFinding, SpEqualToGasDependsOnTheRecordedRecipe) {
  pb::Config ref = Cfg(1, 1, "mean", "token-weighted"), b = Cfg(1, 2, "mean", "token-weighted");
  b.set_gas(2);
  SideFacts sb = Side(b);
  sb.reductions = {{"dense", 2, 2.0, 2.0}};
  const Finding f = ExplainFactor(2.0, "dense", Side(ref), sb, 1e-4);
  EXPECT_EQ(f.cause, Cause::kAmbiguous);
  EXPECT_EQ(f.rerun, Dimension::kGas);
  b.set_loss("local-mean");
  ref.set_loss("local-mean");
  sb.config = b;
  const Finding recipe = ExplainFactor(2.0, "dense", Side(ref), sb, 1e-4);
  EXPECT_EQ(recipe.cause, Cause::kLossMultiplier);
  EXPECT_EQ(recipe.dimension, Dimension::kSp);
  for (const auto& alt : recipe.alternatives) {
    if (alt.dimension == Dimension::kGas) {
      EXPECT_EQ(alt.ruled_out, RuledOut::kRecipeGivesFactor);
    }
  }
}

// tp = 2 against a loss doubled by hand (the TP work's open question): tp copies summed or the loss x 2? With
// no reductions recorded both are left in one dimension, and only recording the reductions tells them apart;
// with B's tp reductions right, the divisor is ruled out.
TEST(FactorFinding, TpAgainstALossTimesTp) {
  pb::Config ref = Cfg(1, 1, "mean", "local-mean"), b = Cfg(1, 1, "mean", "local-mean");
  b.set_tp(2);
  b.set_world(2);
  const Finding bare = ExplainFactor(2.0, "tp-shard", Side(ref), Side(b), 1e-4);
  EXPECT_EQ(bare.cause, Cause::kAmbiguous);
  EXPECT_EQ(bare.rerun, Dimension::kNone);
  EXPECT_TRUE(bare.rerun_with_reductions);
  ASSERT_EQ(bare.alternatives.size(), 2u);
  EXPECT_EQ(bare.alternatives[0].dimension, Dimension::kTp);
  EXPECT_EQ(bare.alternatives[1].dimension, Dimension::kTp);
  SideFacts sb = Side(b);
  sb.reductions = {{"tp-shard", 2, 2.0, 2.0}};
  const Finding right = ExplainFactor(2.0, "tp-shard", Side(ref), sb, 1e-4);
  EXPECT_EQ(right.cause, Cause::kLossMultiplier);
  EXPECT_EQ(right.dimension, Dimension::kTp);
}

// Issue 44's planted bug: only some parameters (the norms) are tp = 2 x the reference while the others match.
// A loss multiple would scale every gradient, so the traces rule it out and leave tp summed as the divisor.
// With dp = tp = 2 and B's recorded reductions dividing as needed, the factor enters outside them: both
// divisors stay, marked, and doubling dp tells them apart.
TEST(FactorFinding, PartOfTheModelScaledIsNoLossMultiple) {
  pb::Config ref = Cfg(1, 1, "mean", "local-mean"), b = Cfg(1, 1, "mean", "local-mean");
  b.set_tp(2);
  b.set_world(2);
  const Finding whole = ExplainFactor(2.0, "dense", Side(ref), Side(b), 1e-4);
  EXPECT_EQ(whole.cause, Cause::kAmbiguous);  // every parameter x 2: the loss or the divisor
  const Finding part = ExplainFactor(2.0, "dense", Side(ref), Side(b), 1e-4, /*others_match=*/true);
  EXPECT_EQ(part.cause, Cause::kReductionDivisor);
  EXPECT_EQ(part.dimension, Dimension::kTp);
  EXPECT_FALSE(part.outside_recorded);  // no reductions recorded: nothing says where it enters
  ASSERT_EQ(part.alternatives.size(), 2u);
  EXPECT_EQ(part.alternatives[0].cause, Cause::kLossMultiplier);
  EXPECT_EQ(part.alternatives[0].ruled_out, RuledOut::kOtherParamsMatch);

  pb::Config b4 = Cfg(2, 1, "mean", "local-mean");
  b4.set_tp(2);
  b4.set_world(4);
  SideFacts sb = Side(b4);
  sb.reductions = {{"dense", 2, 2.0, 2.0}};  // FSDP's reduce-scatter over dp divides by dp, as needed
  const Finding both = ExplainFactor(2.0, "dense", Side(ref), sb, 1e-4, /*others_match=*/true);
  EXPECT_EQ(both.cause, Cause::kAmbiguous);
  int divisors_left = 0, losses = 0;
  for (const auto& alt : both.alternatives) {
    if (alt.cause == Cause::kLossMultiplier) {
      ++losses;
      EXPECT_EQ(alt.ruled_out, RuledOut::kOtherParamsMatch);
    } else if (alt.ruled_out == RuledOut::kNo) {
      ++divisors_left;
      EXPECT_TRUE(alt.outside_recorded);
    }
  }
  EXPECT_EQ(losses, 2);
  EXPECT_EQ(divisors_left, 2);
  EXPECT_EQ(both.rerun, Dimension::kDp);  // dp 4: dp(B) predicts 4, tp(B) still 2
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
