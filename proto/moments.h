// The `stats` payload (count, sum, sum of squares, abs-max, non-finite count)
// computed in one pass: elements are widened inline (no per-element dtype
// switch), non-finite ones are masked out without a branch, and eight double
// lanes accumulate them (16-byte vectors, or 32-byte ones on CPUs with AVX2:
// moments_kernel.h).
//
// Summation order, the only thing that makes two correct implementations
// differ: a slice is cut into blocks of kMomentsBlock elements from its start;
// inside a block, runs of kMomentsChunk elements are summed in 8 plain double
// lanes (element i goes to lane i % 8) and each run's total is added to the
// block's Neumaier-compensated sum; blocks are merged in order with the same
// compensation. So the result depends on the data alone (not on threads or
// SIMD width), and
//   |sum - exact| <= 2^-48 * sum(|v_i|) + 2^-52 * |exact|
// (each run adds kMomentsChunk / 8 = 32 terms per lane, then 3 lane folds),
// and likewise for sum_sq. fp32, bf16 and fp16 squares are exact in double.
#pragma once

#include <cstdint>

#include "gradtrace.pb.h"

namespace gradtrace {

inline constexpr int64_t kMomentsChunk = 256;
inline constexpr int64_t kMomentsBlock = 1 << 16;

struct Moments {
  int64_t count = 0;                // finite elements
  int64_t nonfinite = 0;            // NaN and +-Inf
  double sum = 0, sum_c = 0;        // over finite elements: sum + sum_c
  double sum_sq = 0, sum_sq_c = 0;  // over finite elements: sum_sq + sum_sq_c
  double abs_max = 0;               // over finite elements

  // Adds `other` (the next block) into this one, compensated. Once a sum
  // overflows to Inf it stays Inf (no Inf - Inf = NaN from the correction).
  void Merge(const Moments& other);
  void Fill(pb::StatsPayload* out) const;
};

// One block (count <= kMomentsBlock for the documented order; any count works).
Moments BlockMoments(pb::DType dtype, const void* data, int64_t count);

// The path of a dtype without a vector kernel: each element widened by
// ElementToDouble, summed in the same lanes and order, so for every dtype it
// gives BlockMoments' very bits (slower). A new row of the dtype table gets its
// stats from here.
Moments BlockMomentsElementwise(pb::DType dtype, const void* data, int64_t count);

// The same bits at the baseline vector width (16 bytes), whatever the CPU:
// BlockMoments runs the AVX2 build of the kernel instead where the CPU has it
// (MomentsKernelIsAvx2). For tests and benchmarks that compare the two.
Moments BlockMomentsBaseline(pb::DType dtype, const void* data, int64_t count);
bool MomentsKernelIsAvx2();

// The whole slice: BlockMoments over consecutive kMomentsBlock blocks, merged
// in order. A caller that computes the blocks in parallel and merges them in
// order gets the same bits.
Moments SliceMoments(pb::DType dtype, const void* data, int64_t count);

}  // namespace gradtrace
