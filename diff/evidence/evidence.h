// Evidence a trace set carries about its own reductions, for the diff's
// explanations: per parameter kind, the --self measure (effective divisor of
// PRE_REDUCE sums against POST_REDUCE), the divisor the producer declared
// (BucketRecord.divisor) and the divisor its recorded layout needs. A side
// whose reduction divides as needed carries a loss multiplier, not a
// reduction bug.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "load/trace_set.h"
#include "report/report.h"

namespace gradtrace::diff {

// Empty when the set has no PRE_REDUCE and POST_REDUCE records at `step`.
// Measured on a few parameters of each reduction (SelfOptions.sample): the
// divisor is a bucket's, so its parameters agree on it.
// `accumulating_params`, when not null: how many parameters' buckets
// accumulate across micro-steps (the same pass measures it, on every
// reduction; 0 without those records).
std::vector<ReductionEvidence> CollectReductionEvidence(const TraceSet& set, int64_t step, int threads,
                                                        int* accumulating_params);

// A side's evidence from its self report (--self's, or the live guard's): per parameter kind, the median
// measured divisor of its parameters, with their group size, declared and expected divisors.
std::vector<ReductionEvidence> EvidenceOfSelf(const Report& self);

// One side's CollectReductionEvidence on one thread, run as a work item of the
// diff's comparison (beside its two workers on two cores, a thread of its own
// slowed their first frames).
struct EvidenceJob {
  const TraceSet* set = nullptr;
  int64_t step = 0;
  bool count_accumulating = false;            // CollectReductionEvidence's accumulating_params wanted
  std::vector<ReductionEvidence> reductions;  // Run's results
  int accumulating_params = 0;
  void Run();
  // Its share of work in a comparison's units (elements compared, each two 4-byte values read): the bytes its
  // sample decompresses / 8. Counting accumulation reads more: the pool's stealing evens that out.
  int64_t Weight() const;
};

// The per-rank x per-bucket view of `set` at `step` (TraceSide.bucket_view)
// from a full --self pass, the cells `gradtrace-diff --self SET --step STEP
// [--rtol X]` shows: every reduction, not the evidence's sample, so the diff
// runs it only when asked (DiffOptions.bucket_view, for --html). Empty
// when the set has no PRE_REDUCE and POST_REDUCE records at `step`, or when
// the pass fails (the diff itself does not depend on it).
std::vector<BucketCell> SideBucketView(const TraceSet& set, int64_t step, std::optional<double> rtol, int threads);

// From the StepInfo records of `step` (ranks x micro-steps): the smallest and largest valid_tokens, and the
// loss per data-parallel replica (TraceSide fields; 0 when none recorded).
void StepLossAndTokens(const TraceSet& set, int64_t step, TraceSide* side);

}  // namespace gradtrace::diff
