// The words of a step's checks beside its divisors (--self and the live guard, evidence/self_judge.h):
// non-finite values in a record, and ranks whose optimizer did not step while the others did.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "evidence/self_measurements.h"
#include "gradtrace.pb.h"

namespace gradtrace::diff {

// "NaN or Inf in POST_REDUCE of bucket 3 (group dp, micro-step 0) on rank 1: 'fc.weight', 'fc.bias'"
std::string NonfiniteWords(const pb::RunInfo& run, const NonfiniteRecord& r);

// "rank 1 did not step its optimizer in step 5 while the other ranks did (e.g. a GradScaler that found inf/NaN
// on that rank alone): from here its replicas hold other weights"
std::string SkippedStepWords(const std::vector<int>& ranks, int64_t step);

}  // namespace gradtrace::diff
