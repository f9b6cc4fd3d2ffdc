// The live guard's reference (gradtrace.attach(..., mode="guard", reference=DIR)): a trusted run's trace set
// whose FINAL at a step is compared with this run's FINAL moments at the same step, judged with the diff's
// tolerance and grouped and explained in the diff's words (the one comparison of moments, compare/metrics.h;
// the one grouping, explain.h). Reached from Python through _gtcodec.ReferenceRun.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compare/metrics.h"
#include "explain/explain.h"
#include "load/trace_set.h"
#include "status.h"

namespace gradtrace::diff {

// The moments of each parameter's whole FINAL at `step` in `set` (stats, or the moments of full values;
// replicas read once), by name: a guard's own FINAL when it records it as a trace (gradtrace-train's,
// capture/train/guard_sink.h). Parameters whose FINAL is not whole are left out.
Expected<std::map<std::string, Moments>> FinalMoments(const TraceSet& set, int64_t step);

class ReferenceRun {
 public:
  // The trace set at `dir` (one line naming it and what is wrong when it cannot be read).
  static Expected<ReferenceRun> Load(const std::string& dir);

  // The steps the reference recorded FINAL for.
  const std::vector<int64_t>& steps() const { return steps_; }

  // B = this run (`run`: a rank's RunInfo, `world` ranks), A = the reference, at `step`: per parameter name
  // in both, the reference's FINAL moments (stats, or the moments of its full values) against `mine`, the
  // moments of this run's whole FINAL gradient. Parameters of only one side are left out. `self`, when given:
  // this run's self report of the step (the guard's, explain/self_judge.h), made B's reduction evidence, so that
  // a factor is told from a loss multiple as the diff tells it.
  // `steps`, when given: a set holding this run's StepInfo of the step (gradtrace-train's guard gathers one), whose
  // losses and token counts are B's, as the diff reads each side's (evidence.h StepLossAndTokens).
  Expected<Report> Judge(int64_t step, const pb::RunInfo& run, int world, const std::map<std::string, Moments>& mine,
                         const Report* self = nullptr, const TraceSet* steps = nullptr) const;

 private:
  std::shared_ptr<const TraceSet> set_;
  std::vector<int64_t> steps_;
};

}  // namespace gradtrace::diff
