// Work units of a comparison: sets of aligned parameters gathered together.
// A frame is decompressed once per unit that needs it, so units follow the
// frames: parameters that share a frame on either side go into one unit.
#pragma once

#include <cstdint>
#include <vector>

#include "compare/align.h"
#include "load/trace_set.h"

namespace gradtrace::diff {

struct Unit {
  std::vector<size_t> pairs;  // indexes into Alignment::params
};

// Packs the comparable pairs of `al` into units of max_elems elements or a
// little more (at most 2 x max_elems, or one connected group), in A's file
// order. Parameters connected through shared frames (of `frames_a` or
// `frames_b`, SelectFrames' output) stay in one unit, so each frame is read
// once, unless the connected group exceeds 4 x max_elems: it is then split by
// parameter, and a frame at a cut is read by the units on both sides of it
// (ReaderCache keeps it between neighbouring units; memory stays bounded).
std::vector<Unit> MakeUnits(const Alignment& al, const std::vector<std::vector<const FrameRef*>>& frames_a,
                            const std::vector<std::vector<const FrameRef*>>& frames_b, int64_t max_elems);

}  // namespace gradtrace::diff
