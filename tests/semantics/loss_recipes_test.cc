// The one list of loss recipe names and their aliases (semantics/loss_recipes.h).
#include "loss_recipes.h"

#include "expected_divisor.h"
#include "predict.h"

#include <gtest/gtest.h>

#include <algorithm>

namespace gradtrace::semantics {
namespace {

TEST(LossRecipes, EveryAliasNamesARecipeAndIsNoRecipe) {
  const auto recipes = KnownLossRecipes();
  const auto aliases = LossRecipeAliases();
  ASSERT_FALSE(aliases.empty());
  for (const auto& [alias, recipe] : aliases) {
    EXPECT_NE(std::find(recipes.begin(), recipes.end(), recipe), recipes.end()) << alias << " -> " << recipe;
    EXPECT_EQ(std::find(recipes.begin(), recipes.end(), alias), recipes.end()) << alias;
    EXPECT_EQ(recipe, ResolveLossRecipe(alias).value_or("?")) << alias;
  }
}

// Issue 21: three copies (python/gradtrace/adapters/loss_recipes.py, tools/repro/ds5248/emulation.py and alst.py) now
// read this one list.
TEST(LossRecipes, TheAliasesOfTheDeepSpeedLoops) {
  EXPECT_EQ("local-mean", ResolveLossRecipe("loss").value_or("?"));
  EXPECT_EQ("local-mean-div-sp", ResolveLossRecipe("loss-div-sp").value_or("?"));
  EXPECT_EQ("alst-tutorial", ResolveLossRecipe("alst").value_or("?"));
  EXPECT_EQ("alst-tutorial-div-sp", ResolveLossRecipe("alst-div-sp").value_or("?"));
  for (const std::string& r : KnownLossRecipes()) EXPECT_EQ(r, ResolveLossRecipe(r).value_or("?"));
  EXPECT_FALSE(ResolveLossRecipe("").has_value());
  EXPECT_FALSE(ResolveLossRecipe("Loss").has_value());
  EXPECT_FALSE(ResolveLossRecipe("mean").has_value());
}

// Issue 41 item 5: a loss weighted by the global batch's valid tokens (every rank's summed token loss over all
// ranks' tokens) needs every reduction to sum: divisor 1 over any group (dense), the copies of one expert
// excepted; under a mean over dp it is 1/dp of the gradient, under a sum exact.
TEST(LossRecipes, GlobalTokenSumNeedsSummingReductions) {
  EXPECT_TRUE(RanksSumToGlobalLoss("global-token-sum"));
  EXPECT_FALSE(RanksSumToGlobalLoss("global-token-weighted"));
  pb::Config c;
  c.set_dp(4);
  c.set_sp(2);
  c.set_world(8);
  c.set_gas(1);
  c.set_loss("global-token-sum");
  EXPECT_DOUBLE_EQ(ExpectedDivisor(c, pb::DENSE, 8), 1.0);
  EXPECT_DOUBLE_EQ(ExpectedDivisor(c, pb::DENSE, 4), 1.0);
  c.set_loss("global-token-weighted");  // dp x the rank's summed loss / the global count: a mean over dp
  EXPECT_DOUBLE_EQ(ExpectedDivisor(c, pb::DENSE, 8), 4.0);
  c.set_loss("global-token-sum");
  c.set_scaling("mean");  // DDP's or FSDP2's default: divides by the dp x sp group
  auto mean = Predict(c, pb::DENSE);
  ASSERT_TRUE(mean.has_value());
  EXPECT_DOUBLE_EQ(mean->multiple, 1.0 / 8);
  c.set_scaling("sum");  // set_gradient_divide_factor(1.0), a summing comm hook
  auto sum = Predict(c, pb::DENSE);
  ASSERT_TRUE(sum.has_value());
  EXPECT_DOUBLE_EQ(sum->multiple, 1.0);
}

}  // namespace
}  // namespace gradtrace::semantics
