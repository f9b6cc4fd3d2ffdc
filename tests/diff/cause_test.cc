// Explanations by cause on synthetic pairs (synth_trace.h, reductions planned
// by semantics/): the factor, the verdict and the cause fields of each group.
#include <gtest/gtest.h>

#include <cmath>
#include <set>

#include "compare/diff_engine.h"
#include "test_dirs.h"

namespace gradtrace::diff {
namespace {
using testing::Config;
using testing::Synth;
using testing::SynthSpec;

Report CauseDiff(const std::string& a, const std::string& b) {
  auto r = RunDiff(a, b, {});
  EXPECT_TRUE(r.ok()) << r.status().message();
  return r.ok() ? std::move(*r) : Report{};
}

const Group* ScaleGroup(const Report& r, double scale) {
  for (const auto& g : r.groups) {
    if (g.kind == "scale" && g.scale && std::fabs(*g.scale - scale) < 1e-3 * scale) return &g;
  }
  return nullptr;
}

bool Has(const std::string& text, const std::string& what) { return text.find(what) != std::string::npos; }

const std::set<std::string> kExperts = {"layers.1.mlp.fc1.weight", "layers.1.mlp.fc2.weight"};

// Expert gradients 2x at ep = 2 (averaged over edp, not divided by dp), dense 1.0:
// explained via ep on the expert group, not via dp.
TEST(Cause, ExpertGradientsTwiceAtEp2) {
  SynthSpec a = Config(4, 1, 0, "mean", "token-weighted");
  a.experts = kExperts;
  a.ep = 2;
  a.divide_as_expected = true;
  a.recorded_scaling = "";
  a.framework = "pytorch";
  a.run_id = "ep-a";
  SynthSpec b = a;
  b.divide_as_expected = false;  // "mean" over the edp group
  b.recorded_scaling = "mean";
  b.run_id = "ep-b";
  Report r = CauseDiff(Synth("a", a), Synth("b", b));
  EXPECT_EQ(r.verdict, "scaled");
  const Group* g = ScaleGroup(r, 2.0);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->count, 2);
  EXPECT_EQ(g->param_kind, "expert");
  EXPECT_EQ(g->dimension, semantics::Dimension::kEp);
  EXPECT_EQ(g->cause, semantics::Cause::kReductionDivisor);
  EXPECT_EQ(g->side, "B");
  EXPECT_EQ(g->expression, "ep(B)");
  EXPECT_TRUE(Has(g->explanation, "expert-data-parallel")) << g->explanation;
  EXPECT_FALSE(Has(g->explanation, "#")) << g->explanation;
  const Group* dense = ScaleGroup(r, 1.0);
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->param_kind, "dense");
  EXPECT_EQ(dense->cause, semantics::Cause::kNone);
  // Headline: the finding (2 expert parameters), not the larger matching group.
  EXPECT_EQ(r.groups.front().explanation, g->explanation);
  EXPECT_EQ(r.summary, g->explanation);
}

// Megatron-LM #673: the loss multiplied by cp while the reduction divides as the layout
// needs: a loss multiplier in cp, not "sums the data-parallel ranks" (dp = cp = 2 here).
TEST(Cause, ContextParallelLossTimesCp) {
  SynthSpec a = Config(2, 1, 0, "mean", "token-weighted");
  a.cp = 2;
  a.divide_as_expected = true;  // by dp: the cp ranks add up to the sequence's loss
  a.recorded_scaling = "";
  a.framework = "pytorch";
  a.run_id = "cp-a";
  SynthSpec b = a;
  b.loss_multiplier = 2;  // x cp
  b.run_id = "cp-b";
  Report r = CauseDiff(Synth("a", a), Synth("b", b));
  EXPECT_EQ(r.verdict, "scaled");
  ASSERT_EQ(r.groups.size(), 1u);
  const Group& g = r.groups.front();
  EXPECT_NEAR(*g.scale, 2.0, 1e-4);
  // dp = cp = 2: a loss multiple (the divisors are ruled out by B's own reductions), x cp or x dp (issue 41).
  EXPECT_EQ(g.cause, semantics::Cause::kAmbiguous);
  EXPECT_TRUE(Has(g.explanation, "cp(B) as a loss multiple: B's loss is multiplied by cp")) << g.explanation;
  EXPECT_TRUE(Has(g.explanation, "divide the loss by cp")) << g.explanation;
  EXPECT_TRUE(Has(g.explanation, "or dp(B) as a loss multiple: B's loss is multiplied by dp")) << g.explanation;
  EXPECT_TRUE(Has(g.explanation,
                  "ruled out by the traces: cp(B) as a reduction divisor (B's reductions divide as its "
                  "layout needs), dp(B) as a reduction divisor"))
      << g.explanation;
  EXPECT_TRUE(Has(g.explanation, "to tell them apart, rerun B with dp 4: cp(B) predicts 2.000, dp(B) predicts 4.000"))
      << g.explanation;
  EXPECT_EQ(g.rerun, "rerun B with dp 4: cp(B) predicts 2.000, dp(B) predicts 4.000");
  // The evidence: B's own reductions divide as its layout needs.
  ASSERT_FALSE(r.b.reductions.empty());
  EXPECT_NEAR(r.b.reductions.front().measured, 2.0, 1e-4);
  EXPECT_EQ(r.b.reductions.front().expected, 2.0);
}

// DeepSpeed 0.12.6 ZeRO-2 with MoE: the MoE buckets are divided twice (PR #4957 removed
// it), 0.5 at dp = sp = 2, dense buckets 1.0; predicted from the release table.
TEST(Cause, DeepSpeed0126MoeDoubleDivision) {
  SynthSpec a = Config(2, 2, 2, "deepspeed@0.13.1", "local-mean-div-sp");
  a.experts = kExperts;
  a.run_id = "moe-a";
  SynthSpec b = a;
  b.scaling = "deepspeed@0.12.6";
  b.run_id = "moe-b";
  Report r = CauseDiff(Synth("a", a), Synth("b", b));
  EXPECT_EQ(r.verdict, "scaled");
  const Group* g = ScaleGroup(r, 0.5);
  ASSERT_NE(g, nullptr);
  EXPECT_EQ(g->count, 2);
  EXPECT_EQ(g->param_kind, "expert");
  EXPECT_EQ(g->cause, semantics::Cause::kDoubleDivision);
  EXPECT_EQ(g->side, "B");
  ASSERT_TRUE(g->predicted.has_value());
  EXPECT_DOUBLE_EQ(*g->predicted, 0.5);
  EXPECT_TRUE(Has(g->explanation, "divides MoE buckets twice")) << g->explanation;
  EXPECT_TRUE(Has(g->explanation, "PR #4957")) << g->explanation;
  EXPECT_FALSE(Has(g->explanation, "predict")) << g->explanation;
  EXPECT_EQ(r.summary, g->explanation);
  const Group* dense = ScaleGroup(r, 1.0);
  ASSERT_NE(dense, nullptr);
  EXPECT_EQ(dense->cause, semantics::Cause::kNone);
}

// The #5248 case still reads as before, with the recipe to use.
TEST(Cause, Issue5248UnderDs4530) {
  Report r = CauseDiff(Synth("a", testing::Reference()), Synth("b", Config(1, 2, 2, "ds-4530", "local-mean")));
  EXPECT_EQ(r.verdict, "scaled");
  ASSERT_EQ(r.groups.size(), 1u);
  const Group& g = r.groups.front();
  EXPECT_EQ(g.dimension, semantics::Dimension::kSp);
  EXPECT_EQ(g.cause, semantics::Cause::kLossMultiplier);
  EXPECT_TRUE(Has(g.explanation,
                  "the per-rank loss is a local mean and the reduction divides by dp only (DeepSpeed "
                  "ZeRO-1/2 since #4530)"))
      << g.explanation;
  EXPECT_TRUE(Has(g.explanation, "use backward(loss / sp)")) << g.explanation;
}

// The headline states the most serious finding: one scaled parameter among 13 matching.
TEST(Cause, HeadlineIsMostSeriousFinding) {
  SynthSpec b = testing::Reference();
  b.extra_factor = {{"head.weight", 2.0}};
  b.run_id = "one-scaled";
  Report r = CauseDiff(Synth("a", testing::Reference()), Synth("b", b));
  EXPECT_EQ(r.verdict, "scaled");
  ASSERT_EQ(r.groups.size(), 2u);
  EXPECT_EQ(r.groups.front().count, 1);
  EXPECT_TRUE(Has(r.summary, "B/A = 2.000")) << r.summary;
  EXPECT_FALSE(Has(r.summary, "B matches A")) << r.summary;
}

}  // namespace
}  // namespace gradtrace::diff
