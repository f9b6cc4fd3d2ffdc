#include "explain/explain.h"

#include <gtest/gtest.h>

#include "predict.h"

namespace gradtrace::diff {
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

TraceSide Side(const pb::Config& c, const std::string& framework = "") {
  TraceSide s;
  s.config = c;
  s.framework = framework;
  return s;
}

TEST(Explain, CandidatesIncludeAtomsReciprocalsAndRatios) {
  auto cands = ScaleCandidates(Cfg(1, 2, "mean", "local-mean"), Cfg(2, 4, "ds-4530", "local-mean"));
  auto has = [&](const std::string& e, double v) {
    for (const auto& c : cands) {
      if (c.expr == e) return c.value == v;
    }
    return false;
  };
  EXPECT_TRUE(has("1", 1));
  EXPECT_TRUE(has("sp(B)", 4));
  EXPECT_TRUE(has("1/sp(B)", 0.25));
  EXPECT_TRUE(has("sp(A)", 2));
  EXPECT_TRUE(has("sp(B)/sp(A)", 2));
  EXPECT_TRUE(has("dp(B)", 2));
  EXPECT_TRUE(has("world(B)", 8));
  EXPECT_EQ(cands.front().expr, "1");
}

// DeepSpeed #5248: the canonical sentence.
TEST(Explain, Issue5248SentenceForSp2) {
  Cause cause;
  std::string s = ExplainScale(2.0, 14, 14, "dense", Side(Cfg(1, 1, "mean", "local-mean")),
                               Side(Cfg(1, 2, "ds-4530", "local-mean")), 1e-4, &cause);
  EXPECT_EQ(s,
            "B/A = 2.000 = sp(B) for all 14 parameters: the per-rank loss is a local mean and the reduction divides by "
            "dp only (DeepSpeed ZeRO-1/2 since #4530); use backward(loss / sp) (local-mean-div-sp) or a loss weighted "
            "by the whole sequence's valid tokens");
  EXPECT_EQ(cause.expression, "sp(B)");
  EXPECT_EQ(cause.cause, semantics::Cause::kLossMultiplier);
  EXPECT_EQ(cause.dimension, semantics::Dimension::kSp);
  EXPECT_EQ(cause.side, "B");
  EXPECT_DOUBLE_EQ(*cause.predicted, 2.0);
}

// ZeRO-3 divides by dp only on its all-reduce path (reduce_scatter false): the sentence names that path.
TEST(Explain, Issue5248SentenceNamesZero3Path) {
  Cause cause;
  pb::Config b = Cfg(1, 2, "deepspeed@0.19.8", "local-mean");
  b.set_zero_stage(3);
  std::string s = ExplainScale(2.0, 14, 14, "dense", Side(Cfg(1, 1, "mean", "local-mean")), Side(b), 1e-4, &cause);
  EXPECT_EQ(cause.expression, "sp(B)");
  EXPECT_NE(s.find("(DeepSpeed ZeRO-3 with reduce_scatter false, stage3.py all-reduce path)"), std::string::npos) << s;
}

TEST(Explain, Sp4AmongDp2) {
  Cause cause;
  std::string s = ExplainScale(4.0, 14, 14, "dense", Side(Cfg(1, 1, "mean", "local-mean")),
                               Side(Cfg(2, 4, "ds-4530", "local-mean")), 1e-4, &cause);
  EXPECT_EQ(cause.expression, "sp(B)");
  EXPECT_NE(s.find("B/A = 4.000 = sp(B) for all 14 parameters"), std::string::npos) << s;
}

TEST(Explain, DividedBySpTwice) {
  Cause cause;
  std::string s = ExplainScale(0.5, 3, 14, "dense", Side(Cfg(1, 1, "mean", "local-mean")),
                               Side(Cfg(1, 2, "mean", "local-mean-div-sp")), 1e-4, &cause);
  EXPECT_EQ(cause.expression, "1/sp(B)");
  EXPECT_EQ(cause.cause, semantics::Cause::kReductionDivisor);
  EXPECT_EQ(cause.dimension, semantics::Dimension::kSp);
  EXPECT_NE(s.find("for 3 of 14 parameters"), std::string::npos) << s;
  EXPECT_NE(s.find("divides by sp twice"), std::string::npos) << s;
}

TEST(Explain, UnexplainedFactorSaysSo) {
  Cause cause;
  cause.expression = "x";
  std::string s = ExplainScale(1.7, 14, 14, "dense", Side(Cfg(1, 1, "mean", "local-mean")),
                               Side(Cfg(1, 2, "ds-4530", "local-mean")), 1e-4, &cause);
  EXPECT_TRUE(cause.expression.empty());
  EXPECT_EQ(cause.cause, semantics::Cause::kUnexplained);
  EXPECT_NE(s.find("matches no expression"), std::string::npos) << s;
}

TEST(Explain, PredictionFromConfigs) {
  auto multiple = [](const pb::Config& c, pb::ParamKind k = pb::DENSE) { return semantics::Predict(c, k)->multiple; };
  EXPECT_DOUBLE_EQ(multiple(Cfg(2, 4, "ds-4530", "local-mean")), 4.0);
  EXPECT_DOUBLE_EQ(multiple(Cfg(2, 4, "ds-4530", "local-mean-div-sp")), 1.0);
  EXPECT_DOUBLE_EQ(multiple(Cfg(2, 4, "mean", "local-mean")), 1.0);
  EXPECT_DOUBLE_EQ(multiple(Cfg(2, 4, "sum", "local-mean")), 8.0);
  // Every modelled release per stage: 0.14.0's engine path divides by dp x sp (mean), 0.14.4's by dp.
  EXPECT_DOUBLE_EQ(multiple(Cfg(2, 4, "deepspeed@0.14.0", "local-mean")), 1.0);
  EXPECT_DOUBLE_EQ(multiple(Cfg(2, 4, "deepspeed@0.14.4", "local-mean")), 4.0);
  // 0.12.6 ZeRO-2: MoE buckets divided twice (before PR #4957), dense ones once.
  pb::Config c = Cfg(2, 2, "deepspeed@0.12.6", "local-mean-div-sp");
  c.set_zero_stage(2);
  EXPECT_DOUBLE_EQ(multiple(c), 1.0);
  EXPECT_DOUBLE_EQ(multiple(c, pb::EXPERT), 0.5);
  EXPECT_TRUE(semantics::Predict(c, pb::EXPERT)->double_division);
  c.set_scaling("deepspeed@0.13.1");
  EXPECT_DOUBLE_EQ(multiple(c, pb::EXPERT), 1.0);
  // Expert parallel: mean over the edp group (dp 4 / ep 2) is ep x the mean-loss gradient.
  pb::Config e = Cfg(4, 1, "mean", "token-weighted");
  e.set_ep_size(2);
  e.set_edp(2);
  EXPECT_DOUBLE_EQ(multiple(e), 1.0);
  EXPECT_DOUBLE_EQ(multiple(e, pb::EXPERT), 2.0);
  EXPECT_FALSE(semantics::Predict(Cfg(2, 4, "", "local-mean"), pb::DENSE).has_value());
  EXPECT_FALSE(semantics::Predict(Cfg(2, 4, "mean", "unknown-recipe"), pb::DENSE).has_value());
}

// DeepSpeed history only for DeepSpeed: a plain PyTorch run's sp factor cites no PR.
TEST(Explain, PlainPytorchCitesNoDeepSpeedHistory) {
  Cause cause;
  std::string s = ExplainScale(2.0, 14, 14, "dense", Side(Cfg(1, 1, "mean", "local-mean"), "pytorch"),
                               Side(Cfg(1, 2, "", "local-mean"), "pytorch"), 1e-4, &cause);
  EXPECT_EQ(s.find('#'), std::string::npos) << s;
  EXPECT_EQ(s.find("DeepSpeed"), std::string::npos) << s;
  EXPECT_EQ(cause.dimension, semantics::Dimension::kSp);
  EXPECT_NE(s.find("backward(loss / sp)"), std::string::npos) << s;
  // The same factor under a DeepSpeed policy cites the PR.
  s = ExplainScale(2.0, 14, 14, "dense", Side(Cfg(1, 1, "mean", "local-mean")),
                   Side(Cfg(1, 2, "deepspeed@0.13.1", "local-mean")), 1e-4, &cause);
  EXPECT_NE(s.find("#4530"), std::string::npos) << s;
}

// A side's declared divisor is believed over its measured one: declared = what the layout needs means
// that side reduces right, so its factor is a loss multiplier (cp here, not dp = cp = 2).
TEST(Explain, DeclaredDivisorIsBelieved) {
  pb::Config c = Cfg(2, 1, "", "token-weighted");
  c.set_cp(2);
  c.set_world(4);
  TraceSide a = Side(c, "pytorch"), b = Side(c, "pytorch");
  b.reductions = {{"dense", 4, /*measured=*/4.0, /*declared=*/2.0, /*expected=*/2.0}};
  Cause cause = ExplainCause(2.0, "dense", a, b, 1e-4);
  // A loss multiple, not a divisor (both divisors ruled out); x cp or x dp the traces cannot tell (issue 41).
  EXPECT_EQ(cause.cause, semantics::Cause::kAmbiguous);
  ASSERT_EQ(cause.candidates.size(), 4u);
  for (const auto& c : cause.candidates) {
    EXPECT_EQ(c.ruled_out_by.empty(), c.cause == semantics::Cause::kLossMultiplier) << c.expression;
  }
  EXPECT_EQ(cause.rerun, "rerun B with dp 4: cp(B) predicts 2.000, dp(B) predicts 4.000");
  // Declaring nothing, the measured divisor (1, a sum, not the 2 needed) makes it a reduction divisor.
  b.reductions = {{"dense", 4, 1.0, 0.0, 2.0}};
  cause = ExplainCause(2.0, "dense", a, b, 1e-4);
  EXPECT_EQ(cause.cause, semantics::Cause::kReductionDivisor);
  // A plain mean over the group (4, what DDP does) where the recipe needs 2: the loss is scaled for
  // another reduction (VeOmni PR #338), so the loss carries the factor.
  b.reductions = {{"dense", 4, 4.0, 0.0, 2.0}};
  cause = ExplainCause(0.5, "dense", a, b, 1e-4);
  EXPECT_EQ(cause.cause, semantics::Cause::kAmbiguous);  // a loss multiple: / cp or / dp
  for (const auto& c : cause.candidates) {
    EXPECT_EQ(
        c.cause == semantics::Cause::kReductionDivisor,
        c.ruled_out_by == "B's reductions are the plain mean over their group, the convention a loss is written for")
        << c.expression;
  }
}

// PyTorch #155903 (HSDP, format 1.3's replicate degree): the reduce-scatter divides by the shard
// group (2) while the reduction spans shard x replicate (4): 2 = replicate(B), the reduction's divisor.
TEST(Explain, HsdpDivideFactorNamesTheReplicateDegree) {
  pb::Config ref = Cfg(1, 1, "", "mean");
  pb::Config hsdp = Cfg(4, 1, "", "local-mean");
  hsdp.set_replicate(2);
  TraceSide a = Side(ref, "pytorch"), b = Side(hsdp, "pytorch");
  b.reductions = {{"dense", 4, /*measured=*/2.0, /*declared=*/2.0, /*expected=*/4.0}};
  Cause cause = ExplainCause(2.0, "dense", a, b, 1e-4);
  EXPECT_EQ(cause.cause, semantics::Cause::kReductionDivisor);
  EXPECT_EQ(cause.dimension, semantics::Dimension::kReplicate);
  EXPECT_EQ(cause.expression, "replicate(B)");
  EXPECT_NE(cause.why.find("HSDP replicas"), std::string::npos) << cause.why;
  // Without the replicate degree nothing in the configurations is 2.
  hsdp.set_replicate(0);
  b.config = hsdp;
  EXPECT_EQ(ExplainCause(2.0, "dense", a, b, 1e-4).cause, semantics::Cause::kUnexplained);
}

// DeepSpeed #7749 (0.18.3, ZeRO-2): every gradient divided by gas^2 more than needed: 1/16 at gas 4
// matches 1/gas(B)^2, a double division by gas; 16 at gas 4 is not read as gas^2 (gas x dp is as likely).
TEST(Explain, DivisionByGasTwiceIsNamed) {
  pb::Config c = Cfg(2, 1, "", "local-mean");
  c.set_gas(4);
  TraceSide a = Side(c, "deepspeed"), b = Side(c, "deepspeed");
  Cause cause = ExplainCause(1.0 / 16, "dense", a, b, 1e-4);
  EXPECT_EQ(cause.cause, semantics::Cause::kDoubleDivision);
  EXPECT_EQ(cause.dimension, semantics::Dimension::kGas);
  EXPECT_EQ(cause.expression, "1/gas(B)^2");
  EXPECT_NE(cause.why.find("#7749"), std::string::npos) << cause.why;
  b.framework = "pytorch";
  EXPECT_EQ(ExplainCause(1.0 / 16, "dense", a, b, 1e-4).why.find("#7749"), std::string::npos);
  EXPECT_EQ(ExplainCause(16.0, "dense", a, b, 1e-4).cause, semantics::Cause::kUnexplained);
}

TEST(Explain, GroupsClusterByScale) {
  std::vector<ParamResult> ps(5);
  for (int i = 0; i < 5; ++i) {
    ps[i].name = "p" + std::to_string(i);
    ps[i].verdict = i < 3 ? Verdict::kScaled : Verdict::kMatch;
    ps[i].metrics.basis = Basis::kFull;
    ps[i].metrics.scale = i < 3 ? 2.0 + 1e-7 * i : 1.0;
  }
  ps[4].verdict = Verdict::kMismatch;
  auto groups = GroupParams(ps, Side(Cfg(1, 1, "mean", "local-mean")), Side(Cfg(1, 2, "ds-4530", "local-mean")), 1e-5);
  ASSERT_EQ(groups.size(), 3u);
  // Most serious first: the mismatch, then the scaled group, then the match.
  EXPECT_EQ(groups[0].kind, "mismatch");
  EXPECT_EQ(groups[1].kind, "scale");
  EXPECT_EQ(groups[1].count, 3);
  EXPECT_NEAR(*groups[1].scale, 2.0, 1e-6);
  EXPECT_EQ(groups[1].expression, "sp(B)");
  EXPECT_EQ(groups[1].cause, semantics::Cause::kLossMultiplier);
  EXPECT_EQ(groups[2].cause, semantics::Cause::kNone);
}

}  // namespace
}  // namespace gradtrace::diff
