// FullSums' block (block_sums_kernel.h) with vectors of 4 doubles: this file
// alone is compiled with -mavx2 (diff/CMakeLists.txt), and metrics.cc calls it
// only on CPUs that report AVX2.
#include "compare/block_sums_kernel.h"

namespace gradtrace::diff {

BlockSums SumBlockAvx2(const float* a, const float* b, int64_t n) { return SumBlock<4>(a, b, n); }
BlockSums SumBlockAvx2(const double* a, const double* b, int64_t n) { return SumBlock<4>(a, b, n); }
BlockSums SumBlockAvx2(const float* a, const double* b, int64_t n) { return SumBlock<4>(a, b, n); }
BlockSums SumBlockAvx2(const double* a, const float* b, int64_t n) { return SumBlock<4>(a, b, n); }

}  // namespace gradtrace::diff
