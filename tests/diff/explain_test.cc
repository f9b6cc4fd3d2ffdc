#include "explain.h"

#include <gtest/gtest.h>

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
  std::string expr;
  std::string s =
      ExplainScale(2.0, 14, 14, Cfg(1, 1, "mean", "local-mean"), Cfg(1, 2, "ds-4530", "local-mean"), 1e-4, &expr);
  EXPECT_EQ(s,
            "B/A = 2.000 = sp(B) for all 14 parameters: the per-rank loss is a local mean and the reduction divides by "
            "dp only (DeepSpeed ZeRO-1/2 since #4530)");
  EXPECT_EQ(expr, "sp(B)");
}

// ZeRO-3 divides by dp only on its all-reduce path (reduce_scatter false): the sentence names that path.
TEST(Explain, Issue5248SentenceNamesZero3Path) {
  std::string expr;
  pb::Config b = Cfg(1, 2, "deepspeed@0.19.8", "local-mean");
  b.set_zero_stage(3);
  std::string s = ExplainScale(2.0, 14, 14, Cfg(1, 1, "mean", "local-mean"), b, 1e-4, &expr);
  EXPECT_EQ(expr, "sp(B)");
  EXPECT_NE(s.find("(DeepSpeed ZeRO-3 with reduce_scatter false, stage3.py all-reduce path)"), std::string::npos) << s;
}

TEST(Explain, Sp4AmongDp2) {
  std::string expr;
  std::string s =
      ExplainScale(4.0, 14, 14, Cfg(1, 1, "mean", "local-mean"), Cfg(2, 4, "ds-4530", "local-mean"), 1e-4, &expr);
  EXPECT_EQ(expr, "sp(B)");
  EXPECT_NE(s.find("B/A = 4.000 = sp(B) for all 14 parameters"), std::string::npos) << s;
}

TEST(Explain, DividedBySpTwice) {
  std::string expr;
  std::string s =
      ExplainScale(0.5, 3, 14, Cfg(1, 1, "mean", "local-mean"), Cfg(1, 2, "mean", "local-mean-div-sp"), 1e-4, &expr);
  EXPECT_EQ(expr, "1/sp(B)");
  EXPECT_NE(s.find("for 3 of 14 parameters"), std::string::npos) << s;
  EXPECT_NE(s.find("divides by sp twice"), std::string::npos) << s;
}

TEST(Explain, UnexplainedFactorSaysSo) {
  std::string expr = "x";
  std::string s =
      ExplainScale(1.7, 14, 14, Cfg(1, 1, "mean", "local-mean"), Cfg(1, 2, "ds-4530", "local-mean"), 1e-4, &expr);
  EXPECT_TRUE(expr.empty());
  EXPECT_NE(s.find("matches no expression"), std::string::npos) << s;
}

TEST(Explain, PredictionFromConfigs) {
  EXPECT_DOUBLE_EQ(*PredictedMultiple(Cfg(2, 4, "ds-4530", "local-mean")), 4.0);
  EXPECT_DOUBLE_EQ(*PredictedMultiple(Cfg(2, 4, "ds-4530", "local-mean-div-sp")), 1.0);
  EXPECT_DOUBLE_EQ(*PredictedMultiple(Cfg(2, 4, "mean", "local-mean")), 1.0);
  EXPECT_FALSE(PredictedMultiple(Cfg(2, 4, "deepspeed@0.14.0", "local-mean")).has_value());
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
  auto groups = GroupParams(ps, Cfg(1, 1, "mean", "local-mean"), Cfg(1, 2, "ds-4530", "local-mean"), 1e-5);
  ASSERT_EQ(groups.size(), 3u);
  EXPECT_EQ(groups[0].kind, "scale");
  EXPECT_EQ(groups[0].count, 3);
  EXPECT_NEAR(*groups[0].scale, 2.0, 1e-6);
  EXPECT_EQ(groups[0].expression, "sp(B)");
}

}  // namespace
}  // namespace gradtrace::diff
