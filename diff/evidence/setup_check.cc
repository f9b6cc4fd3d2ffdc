#include "evidence/setup_check.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "compare/tolerance.h"

namespace gradtrace::diff {
namespace {

// Two sketches of one parameter's initial values agree within rounding of the
// coarser dtype (a bf16 run against an fp32 reference rounds each weight once).
bool SketchesAgree(const pb::ParamInfo& x, const pb::ParamInfo& y) {
  const double u = std::max(UnitRoundoff(x.dtype()), UnitRoundoff(y.dtype()));
  for (int j = 0; j < x.init_sketch_size(); ++j) {
    const double p = x.init_sketch(j), q = y.init_sketch(j);
    if (std::isnan(p) && std::isnan(q)) continue;
    if (!(std::fabs(p - q) <= 2 * u * std::max(std::fabs(p), std::fabs(q)))) return false;
  }
  return true;
}

struct InputMoments {
  double count = 0, sum = 0, sumsq = 0;
};

// Per step: the input moments summed over ranks (optimizer-step StepInfo).
std::map<int64_t, InputMoments> StepInputs(const TraceSet& s) {
  std::map<int64_t, InputMoments> out;
  for (const RankStep& r : s.steps()) {
    if (!r.info.optimizer_step() || r.info.input_count() <= 0) continue;
    InputMoments& m = out[r.info.step()];
    m.count += static_cast<double>(r.info.input_count());
    m.sum += r.info.input_sum();
    m.sumsq += r.info.input_sumsq();
  }
  return out;
}

// Mean and mean square agree: they do not depend on how ranks split the batch
// (ranks that see the same inputs, as tensor-parallel ones do, weigh alike).
bool InputsAgree(const InputMoments& x, const InputMoments& y) {
  const double mx = x.sum / x.count, my = y.sum / y.count;
  const double qx = x.sumsq / x.count, qy = y.sumsq / y.count;
  constexpr double kRtol = 1e-6;  // double sums of the same values in another order
  const double scale = std::sqrt(std::max(qx, qy));
  return std::fabs(mx - my) <= kRtol * scale + 1e-300 && std::fabs(qx - qy) <= kRtol * std::max(qx, qy) + 1e-300;
}

}  // namespace

SetupDifference CheckSetup(const TraceSet& a, const TraceSet& b, const Alignment& al) {
  SetupDifference d;
  std::vector<std::string> names;
  for (const ParamPair& p : al.params) {
    if (p.id_a < 0 || p.id_b < 0 || !p.problem.empty()) continue;
    const pb::ParamInfo& x = a.run().params(p.id_a);
    const pb::ParamInfo& y = b.run().params(p.id_b);
    if (x.init_sketch_size() == 0 || x.init_sketch_size() != y.init_sketch_size()) continue;
    ++d.params_checked;
    if (SketchesAgree(x, y)) continue;
    ++d.params_differ;
    if (names.size() < 3) names.push_back(p.name);
  }
  if (d.params_differ > 0) {
    d.verdict = "different-start";
    std::string list;
    for (const std::string& n : names) list += (list.empty() ? "" : ", ") + n;
    if (d.params_differ > static_cast<int>(names.size())) list += ", ...";
    d.summary = "A and B start from different weights (" + std::to_string(d.params_differ) + " of " +
                std::to_string(d.params_checked) + " parameters differ at their initial values: " + list +
                "): another init seed or checkpoint, not a gradient bug; compare runs that start alike";
    return d;
  }
  // A pipeline stage's first argument is an activation, not the batch.
  if (a.config().pp() > 1 || b.config().pp() > 1) return d;
  const auto ia = StepInputs(a), ib = StepInputs(b);
  for (const auto& [step, x] : ia) {
    auto it = ib.find(step);
    if (it == ib.end()) continue;
    ++d.data_steps_checked;
    if (!InputsAgree(x, it->second) && d.first_data_step < 0) d.first_data_step = step;
  }
  if (d.first_data_step >= 0) {
    d.verdict = "different-data";
    d.summary = "A and B saw different data from step " + std::to_string(d.first_data_step) +
                " (the mean or mean square of the model inputs over all ranks differ): another data order, seed or "
                "sampler, not a gradient bug";
  }
  return d;
}

}  // namespace gradtrace::diff
