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
#include <utility>
#include <vector>

namespace gradtrace::diff {

// Where a mismatch enters the model (Group::localisation, since schema 1.9): the deepest module whose parameters
// both differ and agree with A, and its child that differs.
struct Localisation {
  std::string module;     // where the difference enters: the differing child of `within`
  std::string within;     // the deepest module holding both differing and agreeing parameters
  std::string param;      // the last differing parameter of `module` in the model's recorded order
  int differ_module = 0;  // parameters of `module` that differ (1 when `module` is the parameter itself)
  int differ_within = 0;  // parameters of `within` that differ (those of `module` among them)
  int agree_within = 0;   // parameters of `within` that agree with A (no mismatch)
  int differ = 0;         // in the whole model
  int agree = 0;
};

// Each parameter's name and whether it is a mismatch, in the model's recorded order (the diff's alignment order).
// None when no parameter is a mismatch, or when no module below the model's root holds both a mismatch and a
// parameter that is none.
std::optional<Localisation> LocateMismatch(const std::vector<std::pair<std::string, bool>>& params);

// "; it enters at 'model.layers.1.mlp.gate': of the parameters of 'model.layers.1.mlp', the 1 in it differs and the
// 2 others agree with A; in all, 13 of the model's 17 parameters differ".
std::string LocalisationWords(const Localisation& where);

}  // namespace gradtrace::diff
