// The elements of a parameter whose initial values a trace records
// (ParamInfo.init_sketch, format 1.4, FORMAT.md 4.1): K = min(16, numel)
// evenly spaced elements, element floor((2j + 1) * numel / (2K)) for
// j = 0 .. K-1 of the flattened parameter. Every producer calls this (Python
// through the _gtcodec binding), so two traces sketch the same elements.
#pragma once

#include <cstdint>
#include <vector>

namespace gradtrace {

std::vector<int64_t> InitSketchPositions(int64_t numel);

}  // namespace gradtrace
