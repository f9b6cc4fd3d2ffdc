// Fitting trace sets under a size limit: what each parameter costs in each
// capture mode, and the choice per parameter -- full, sketch:K or stats, the
// same for every set so they stay comparable (sketch positions depend on the
// parameter and K only) -- that spends the budget on the parameters the diff
// found different first.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "load/trace_set.h"
#include "slice_codec.h"
#include "status.h"

namespace gradtrace::pack {

// Measured on the captured traces (all sets together).
struct ParamCost {
  std::string name;
  int64_t numel = 0;
  double full_bytes = 0;    // stored bytes of its full slices (each frame's stored size shared by payload bytes)
  double copies = 0;        // sum over its full slices of count / numel: sketch values per unit of K
  int64_t full_slices = 0;  // slices a re-encoding replaces
};
struct Costs {
  std::vector<ParamCost> params;  // in the first set's table order
  uint64_t total_bytes = 0;       // all trace files
  uint64_t fixed_bytes = 0;       // what re-encoding keeps: headers, RunInfo, steps, index, non-full slices
};
// Reads every data frame of every set once. Errors name the file.
Expected<Costs> MeasureCosts(const std::vector<const diff::TraceSet*>& sets,
                             const std::function<void(uint64_t, uint64_t)>& progress);

// Estimated stored bytes per slice and per sketch value after zstd, from
// measurement (docs/user/bug-report.md); the pack corrects for the error by
// measuring what it wrote and planning again with a smaller budget.
inline constexpr double kStatsSliceBytes = 48;
inline constexpr double kSketchSliceBytes = 24;
inline constexpr double kSketchValueBytes = 11;
inline constexpr int32_t kMinSketchK = 32;
// The first round gives every parameter the same K, at most this one, so a
// budget reaches all parameters before the second round deepens, in priority
// order, the ones that differ.
inline constexpr int32_t kBreadthSketchK = 1024;

struct Choice {
  std::string name;
  CaptureMode mode;  // what its full slices become (full: kept as captured)
  std::string why;   // one line for the README's table
  double est_bytes = 0;
};

// The choice for every parameter of `costs`, in `priority` order (names the
// diff found different first; names missing from it follow in table order).
// `differs` holds a short verdict per name that differs ("scaled",
// "mismatch", ...). `budget` bounds the estimated trace bytes.
// InvalidArgument when even stats for every parameter do not fit.
Expected<std::vector<Choice>> PlanFidelity(const Costs& costs, const std::vector<std::string>& priority,
                                           const std::map<std::string, std::string>& differs, double budget);

// "12.3 MB" (decimal units, as bug trackers state their limits).
std::string HumanBytes(double bytes);

}  // namespace gradtrace::pack
