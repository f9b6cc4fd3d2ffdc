// What the index says about each frame: one definition, used by the writer to
// build entries and by the reader's verification to check them.
#pragma once

#include <cstdint>
#include <string>

#include "gradtrace.pb.h"

namespace gradtrace {

// The entry for a StepInfo frame, and for one BucketRecord frame (after
// chunking: the chunk's own slices). Offset, type and raw_len are the frame's
// and are set by whoever knows them.
pb::IndexEntry StepEntry(const pb::StepInfo& step);
pb::IndexEntry CatalogueEntry(const pb::BucketRecord& record);

// Empty when `listed` describes the frame that `actual` was built from, else
// the first field that differs ("step 3 vs 4"). Catalogue fields are compared
// only for a file of minor version >= format::kMinorCataloguedIndex.
std::string EntryMismatch(const pb::IndexEntry& listed, const pb::IndexEntry& actual, uint16_t minor);

}  // namespace gradtrace
