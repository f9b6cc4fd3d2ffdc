#include "init_sketch.h"

#include <algorithm>

#include "format.h"

namespace gradtrace {

std::vector<int64_t> InitSketchPositions(int64_t numel) {
  const int64_t k = std::min<int64_t>(format::kInitSketchSize, std::max<int64_t>(numel, 0));
  std::vector<int64_t> out;
  out.reserve(static_cast<size_t>(k));
  for (int64_t j = 0; j < k; ++j) {
    // Exact in 128 bits for every int64 numel; the result is below numel.
    const __int128 pos = static_cast<__int128>(2 * j + 1) * numel / (2 * k);
    out.push_back(static_cast<int64_t>(pos));
  }
  return out;
}

}  // namespace gradtrace
