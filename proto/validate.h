// Semantic checks of decoded messages: everything a consumer indexes with
// (param ids, element ranges, payload sizes) is checked once, here, so readers
// of a hostile file never index out of bounds. Messages carry no path or
// offset; the reader prefixes them.
#pragma once

#include <string_view>
#include <vector>

#include "gradtrace.pb.h"
#include "status.h"

namespace gradtrace {

// params_size() <= kMaxParams (LimitExceeded otherwise); params[i].id == i;
// known dtype; non-negative dims; numel == product(shape) without overflow;
// rank, its coordinates and every group member non-negative, the rank and the
// members below a recorded world, no member listed twice in a group.
Status ValidateRunInfo(const pb::RunInfo& run);

// Every slice names a parameter of `run`, covers [offset, offset + count)
// inside it, has a known dtype and exactly one payload consistent with count:
// full: count * DTypeSize bytes; sketch: as many values as positions,
// positions strictly ascending inside the range; stats: count + nonfinite ==
// slice count.
// `full_data`: the full slices' bytes are these (record_view.h), not the record's.
Status ValidateBucketRecord(const pb::RunInfo& run, const pb::BucketRecord& record,
                            const std::vector<std::string_view>* full_data = nullptr);

}  // namespace gradtrace
