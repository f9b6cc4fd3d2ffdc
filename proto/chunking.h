// Splitting a BucketRecord that is too large for one frame, and joining the
// pieces back (FORMAT.md, "Chunking").
#pragma once

#include <cstddef>
#include <vector>

#include "gradtrace.pb.h"
#include "status.h"

namespace gradtrace {

// Splits `record` into records that each serialize to at most `target` bytes:
// slices are packed in order; a full slice that does not fit is cut into
// element ranges, a sketch slice between positions. Only the last slice of a
// chunk is ever cut, and that chunk gets last_slice_continues. Every piece
// keeps the record's other fields and gets chunk = i, chunk_count = n.
// Returns {record} unchanged when it already fits. InvalidArgument when an
// uncuttable slice (stats, or a sketch with one position) exceeds the target.
Expected<std::vector<pb::BucketRecord>> SplitRecord(const pb::BucketRecord& record, size_t target);

// The inverse of SplitRecord: takes the chunks of one record (any order) and
// returns the record with cut slices joined. A lone unsplit record
// (chunk_count 0 or 1) is returned as is. Corruption when chunks are missing,
// repeated, disagree on the record's identity, or do not join.
Expected<pb::BucketRecord> MergeChunks(std::vector<pb::BucketRecord> chunks);

}  // namespace gradtrace
