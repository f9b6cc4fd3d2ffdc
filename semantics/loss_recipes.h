// What each named loss recipe's ranks' gradients add up to. A sequence split
// over sp x cp ranks (Ulysses sp, context parallel cp) is the "split"; every
// recipe is divided by gas unless the producer says otherwise.
//   local-mean, alst-tutorial            the split ranks add up to split x the sequence's gradient
//   local-mean-div-sp, token-weighted,   the split ranks add up to the sequence's gradient
//   full-sequence, global-token-weighted,
//   alst-tutorial-div-sp
//   global-token-sum                     every rank's summed token loss over the valid tokens of the whole
//                                        global batch: all ranks (dp x split) add up to the batch's gradient,
//                                        so the reductions must sum (FSDP2 set_gradient_divide_factor(1.0),
//                                        a DDP comm hook that sums)
// (capture/train/loss.h implements the gradtrace-train ones; alst-tutorial is the
// ALST tutorial's loop, where every SP rank back-propagates the whole loss
// through all_gather, whose backward sums.)
#pragma once

#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace gradtrace::semantics {

// Every recipe named above.
std::vector<std::string> KnownLossRecipes();

// The other spellings, alias -> recipe, the one list: the DeepSpeed loops'
// command lines (tools/repro, gradtrace-deepspeed-versions) name the #5248
// issue's `loss` and `loss / sp`, and the ALST tutorial's loss and that / sp.
std::vector<std::pair<std::string, std::string>> LossRecipeAliases();

// `name` when it names a recipe, the recipe an alias stands for; empty otherwise.
std::optional<std::string> ResolveLossRecipe(const std::string& name);

// True for the recipes whose split ranks add up to the sequence's gradient.
bool SplitRanksSumToSequenceLoss(const std::string& loss);

// The multiple of the sequence's gradient that its `split` ranks add up to
// (split or 1); empty for an unknown recipe.
std::optional<double> SplitShare(const std::string& loss, int split);

// True for the recipes whose ranks all add up to the global batch's gradient (global-token-sum): every
// reduction of theirs must sum, dividing by nothing.
bool RanksSumToGlobalLoss(const std::string& loss);

// The recipe to use instead of `loss` when it over-counts the split ranks,
// in words: "backward(loss / sp) (local-mean-div-sp) or a token-weighted loss".
std::string SplitFix(const std::string& loss, const std::string& dimension);

}  // namespace gradtrace::semantics
