// gradtrace-diff --merge PART...: the partial reports of all N shards of one
// diff, reassembled into the Comparison a single process would have made, for
// the same judge (diff_engine.h). The parts may be given in any order.
#pragma once

#include <string>
#include <vector>

#include "compare/diff_engine.h"
#include "status.h"

namespace gradtrace::diff {

// Reads and checks `paths`: each a partial report (partial_report.h), all of
// the same diff (same inputs fingerprint) and the same N, every shard 0..N-1
// exactly once, every parameter exactly once. Errors are one line naming the
// offending file (or, for a shard no file holds, the files given). The result
// holds every parameter in alignment order, shard 0/1, and the directory names
// of shard 0's part. `bucket_view`: keep the sides' bucket views shard 0's part
// carries (the merge writes HTML); false drops them, as a single-process diff
// without --html computes none (DiffOptions.bucket_view).
Expected<Comparison> MergeParts(const std::vector<std::string>& paths, bool bucket_view = false);

}  // namespace gradtrace::diff
