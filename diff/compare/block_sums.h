// What one block of FullSums (metrics.h) adds, and the AVX2 build of the block
// (block_sums_avx2.cc), which metrics.cc calls on CPUs that have AVX2.
#pragma once

#include <cstdint>

namespace gradtrace::diff {

struct BlockSums {
  double aa = 0, ab = 0, bb = 0, scale = 0, res2 = 0, cross = 0, err2 = 0, max_abs = 0;
  int64_t nonfinite_a = 0, nonfinite_b = 0;
};

#if GRADTRACE_BLOCK_SUMS_AVX2
BlockSums SumBlockAvx2(const float* a, const float* b, int64_t n);
BlockSums SumBlockAvx2(const double* a, const double* b, int64_t n);
BlockSums SumBlockAvx2(const float* a, const double* b, int64_t n);
BlockSums SumBlockAvx2(const double* a, const float* b, int64_t n);
#endif

}  // namespace gradtrace::diff
