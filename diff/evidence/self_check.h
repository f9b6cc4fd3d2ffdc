// --self A: no reference run needed. For every bucket reduced over a group,
// POST_REDUCE on each member is compared with the sum of PRE_REDUCE over the
// group's ranks; P ≈ S/d gives the effective divisor d = <S,S>/<S,P>. ZeRO-1/2
// POST_REDUCE holds only the rank's partition: its slices' parameter offsets
// locate it in the summed bucket (bucket_numel/partition_* are cross-checked).
//
// Expected divisor: semantics::ExpectedDivisor from the parameter's recorded
// kind (ParamInfo.kind), its group's size and the loss recipe; expert
// gradients need the dense divisor, not their edp group's size. What a measured
// divisor means (the expression it equals, its cause and dimension) is
// semantics::ExplainDivisor's (divisor_finding.h); this file puts it into words.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "compare/step_table.h"
#include "gradtrace.pb.h"
#include "load/trace_set.h"
#include "report/report.h"
#include "status.h"

namespace gradtrace::diff {

struct SelfOptions {
  std::optional<int64_t> step;  // default: first step with POST_REDUCE records
  std::optional<double> rtol;
  int threads = 0;
  bool progress = false;
  // The diff's evidence pass (evidence.h), which needs one divisor per parameter
  // kind: measures a few parameters of each reduction (self_check.cc,
  // SampleReductions); `accumulation` false skips finding buckets that
  // accumulate across micro-steps (SelfParam.accumulates stays false).
  bool sample = false;
  bool accumulation = true;
  // The two checks that read every FINAL record of the step, in one pass:
  // the grad norm (read only when the set reported one) and the agreement of
  // each parameter's replicas. With both false (the diff's evidence and
  // per-side bucket views, evidence.h, need neither) FINAL is not read here.
  bool grad_norm = true;
  bool replicas = true;
};

Expected<Report> SelfCheckSet(const TraceSet& set, const SelfOptions& options);
// The decompressed bytes of the frames a sampled pass (SelfOptions.sample) at `step` reads, from the catalogue:
// what its work is, for a scheduler to weigh it against other work.
uint64_t SampledBytes(const TraceSet& set, int64_t step);
Expected<Report> RunSelfCheck(const std::string& dir, const SelfOptions& options);

// --self without --step: every step with PRE_REDUCE and POST_REDUCE records,
// reporting the first that is not ok (else the first), with Report.steps a
// row per step when there are several. With options.step it is SelfCheckSet.
Expected<Report> SelfCheckSteps(const TraceSet& set, const SelfOptions& options);
Expected<Report> RunSelfCheckSteps(const std::string& dir, const SelfOptions& options);
// --self --step all: one self-check per such step (step_table.h renders it).
Expected<StepTable> SelfCheckAllSteps(const TraceSet& set, const SelfOptions& options);
Expected<StepTable> RunSelfCheckAllSteps(const std::string& dir, const SelfOptions& options);

}  // namespace gradtrace::diff
