// One parameter larger than a window compared window by window (issue 24
// item 2): both sides gathered a window at a time (window_gather.h), the
// metrics summed over the windows (metrics.h FullSums), so the diff's memory
// is bounded by the window and the frames in flight, not the parameter.
//
// Results are the whole-parameter path's (side_compare.h) up to summation
// order in the full basis, and the same bit for bit in the sketch and stats
// bases. Where a side holds full values but the answer needs the sketch or
// stats basis (mixed capture modes, or a side not complete), a second pass
// over the windows reads what that basis needs (the full values at the sketch
// positions, the moments of complete full values).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "compare/side_compare.h"
#include "load/gather.h"

namespace gradtrace::diff {

struct WindowedResult {
  // A record's full slices are not in element order: compare the parameter whole (gather.h) instead.
  bool whole = false;
  Metrics metrics;
  std::string note;
  SideSummary a, b;
};

// Parameter id_x of `x` against id_y of `y` (same numel), from the frames
// SelectFrames picked, in windows of `window` elements. Errors are bad input,
// one line naming the file, frame and parameter.
Status CompareWindowed(const TraceSet& x, const TraceSet& y, const std::vector<std::vector<const FrameRef*>>& frames_x,
                       const std::vector<std::vector<const FrameRef*>>& frames_y, int32_t id_x, int32_t id_y,
                       Combine combine, int64_t window, ReaderCache* readers, WindowedResult* out);

}  // namespace gradtrace::diff
