// Where a mismatch enters the model (issue 48): a term added to the loss at one module (an MoE router's auxiliary
// loss, a z-loss) changes the gradient of that module and of everything that feeds it, and of nothing else:
// the experts beside the router and everything after it agree with A. So the deepest module (by the names'
// dotted structure) that holds both differing and agreeing parameters is where the paths part, and its child
// that differs is where the difference enters ('model.layers.1.mlp' holds the router 'gate', which differs, and
// the experts, which agree). Names, not the recorded order, decide it: modules are registered in an order of
// their own (a layer's norms after its MLP), not the forward pass's.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "report/report.h"

namespace gradtrace::diff {

// `params` in the model's recorded order (the diff's alignment order). None when no parameter is a mismatch, or
// when no module below the model's root holds both a mismatch and a parameter that is none.
std::optional<Localisation> LocateMismatch(const std::vector<ParamResult>& params);

// "; it enters at 'model.layers.1.mlp.gate': of the parameters of 'model.layers.1.mlp', the 1 in it differs and the
// 2 others agree with A; in all, 13 of the model's 17 parameters differ".
std::string LocalisationWords(const Localisation& where);

}  // namespace gradtrace::diff
