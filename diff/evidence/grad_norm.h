// Gradient bug or logging bug: the grad norm a framework reported for the
// compared step (StepInfo.reported_grad_norm, format 1.2) against the norm of
// the FINAL gradients the trace holds. Logging-only bugs (the norm printed is
// wrong, the gradients are right) then read "gradients match, the reported
// norm is off by X" instead of looking like a training bug.
#pragma once

#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "load/gather.h"
#include "load/trace_set.h"
#include "report/report.h"
#include "status.h"

namespace gradtrace::diff {

// The norm the producer reported for `step`: rank 0's optimizer-step StepInfo
// (or, lacking one, the last StepInfo of the step that carries a norm).
std::optional<double> ReportedGradNorm(const TraceSet& set, int64_t step);

// Relative disagreement beyond which a reported norm is called off: norms
// are summed in another order, often in fp32 over bf16 gradients.
inline constexpr double kGradNormRtol = 1e-3;

// Compares each side's reported norm with sqrt(sum of ||FINAL_p||^2) over
// `params` (judged results of a phase-final diff). Empty when neither side
// reported a norm, the phase is not final, or not every parameter was
// compared in full (a partial norm proves nothing).
std::optional<GradNormCheck> CheckGradNorms(const Report& r);

// sqrt(sum of ||FINAL_p||^2) over every parameter, summed from VisitFinal's
// batches (Add may be called from any worker) in one order whatever the threads.
class FinalNormSum {
 public:
  void Add(const std::vector<int32_t>& ids, const std::vector<SideValues>& values);
  // Empty when a parameter is not held in full (absent, sketch, stats, truncated).
  std::optional<double> Norm() const;

 private:
  mutable std::mutex mu_;
  std::map<int32_t, double> squares_;  // by the batch's first id
  bool whole_ = true;
};

// --self and the guard (evidence/self_judge.h): the norm the run reported for the report's step
// (ReportedGradNorm) against `final_norm`, the norm of its FINAL gradients there (--self: FinalNormSum
// over a VisitFinal pass shared with its replica check, read only when the set reported a norm). Sets
// report->grad_norm (side a; nothing when `reported` or `final_norm` is empty) and, when misreported, a
// "grad-norm" finding and -- if the reductions are ok -- the summary. The verdict and exit code
// stay those of the reductions, as in the diff.
void AddSelfGradNorm(std::optional<double> reported, std::optional<double> final_norm, Report* report);

// Every parameter's FINAL at `step`, ranks joined as replicas/partitions, in
// batches of at most 4 Mi elements on `threads` workers: visit(ids, values)
// is called once per batch (from any worker; values[i] is ids[i]'s).
Status VisitFinal(const TraceSet& set, int64_t step, int threads,
                  const std::function<void(const std::vector<int32_t>&, const std::vector<SideValues>&)>& visit);

}  // namespace gradtrace::diff
