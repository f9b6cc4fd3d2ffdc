// The one list of loss recipe names and their aliases (semantics/loss_recipes.h).
#include "loss_recipes.h"

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

}  // namespace
}  // namespace gradtrace::semantics
