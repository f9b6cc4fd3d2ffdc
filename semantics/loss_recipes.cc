#include "loss_recipes.h"

namespace gradtrace::semantics {

namespace {

const char* const kSplitTimes[] = {"local-mean", "alst-tutorial"};
const char* const kSplitOnce[] = {"local-mean-div-sp",     "token-weighted",       "full-sequence",
                                  "global-token-weighted", "alst-tutorial-div-sp", "global-token-sum"};
const char* const kGlobalSum = "global-token-sum";
const char* const kAliases[][2] = {{"loss", "local-mean"},
                                   {"loss-div-sp", "local-mean-div-sp"},
                                   {"alst", "alst-tutorial"},
                                   {"alst-div-sp", "alst-tutorial-div-sp"}};

}  // namespace

std::vector<std::string> KnownLossRecipes() {
  std::vector<std::string> out(std::begin(kSplitTimes), std::end(kSplitTimes));
  out.insert(out.end(), std::begin(kSplitOnce), std::end(kSplitOnce));
  return out;
}

std::vector<std::pair<std::string, std::string>> LossRecipeAliases() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& a : kAliases) out.emplace_back(a[0], a[1]);
  return out;
}

std::optional<std::string> ResolveLossRecipe(const std::string& name) {
  for (const std::string& r : KnownLossRecipes()) {
    if (name == r) return r;
  }
  for (const auto& a : kAliases) {
    if (name == a[0]) return std::string(a[1]);
  }
  return std::nullopt;
}

bool SplitRanksSumToSequenceLoss(const std::string& loss) {
  for (const char* r : kSplitOnce) {
    if (loss == r) return true;
  }
  return false;
}

std::optional<double> SplitShare(const std::string& loss, int split) {
  if (SplitRanksSumToSequenceLoss(loss)) return 1.0;
  for (const char* r : kSplitTimes) {
    if (loss == r) return split > 0 ? split : 1;
  }
  return std::nullopt;
}

bool RanksSumToGlobalLoss(const std::string& loss) { return loss == kGlobalSum; }

std::string SplitFix(const std::string& loss, const std::string& dimension) {
  const std::string d = dimension.empty() ? "sp" : dimension;
  if (loss == "alst-tutorial") return "backward(loss / " + d + ") (alst-tutorial-div-sp) or a token-weighted loss";
  return "backward(loss / " + d + ") (local-mean-div-sp) or a loss weighted by the whole sequence's valid tokens";
}

}  // namespace gradtrace::semantics
