// The body of FullSums' block (metrics.h), written once for two vector widths:
// the baseline build (metrics.cc, vectors of 2 doubles: SSE2 on x86-64) and
// the AVX2 build (block_sums_avx2.cc, vectors of 4, compiled with -mavx2 and
// called only on CPUs that have it). Both put element i in lane i % kSumLanes
// and add in the same order, so they give the same bits (not -mfma: a fused
// multiply-add would round once less).
//
// Include only from those two files. Everything here has internal linkage on
// purpose: each file keeps its own copy compiled for its own instruction set
// (a shared inline function would let the linker keep the AVX2 copy for the
// baseline path, which then faults on a CPU without AVX2).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "compare/block_sums.h"
#include "compare/metrics.h"

namespace gradtrace::diff {
namespace {  // NOLINT(build/namespaces): one copy per instruction set, see above

#define GT_INLINE [[gnu::always_inline]] inline

// kSumLanes partial sums as kSumLanes / N vectors of N doubles (GCC's vector extension: SIMD at the file's
// instruction set without relying on the auto-vectorizer, which left the loops scalar at -O2). Lane l is element
// N k + j of vector k: the sums are those of scalar lanes, whatever N.
template <int N>
struct Vec;
template <>
struct Vec<2> {
  using D = double __attribute__((vector_size(16)));
  using U = uint64_t __attribute__((vector_size(16)));
};
template <>
struct Vec<4> {
  using D = double __attribute__((vector_size(32)));
  using U = uint64_t __attribute__((vector_size(32)));
};

template <int N, typename T>
GT_INLINE typename Vec<N>::D Load(const T* p) {
  typename Vec<N>::D v;
  for (int j = 0; j < N; ++j) v[j] = static_cast<double>(p[j]);
  return v;
}
template <int N>
GT_INLINE typename Vec<N>::D Abs(typename Vec<N>::D v) {
  using U = typename Vec<N>::U;
  const U mask = U{} + ~(uint64_t{1} << 63);
  return reinterpret_cast<typename Vec<N>::D>(reinterpret_cast<U>(v) & mask);
}
// max(m, v) as std::max(m, v) per lane: v only where m < v, so NaN never wins.
template <int N>
GT_INLINE typename Vec<N>::D Max(typename Vec<N>::D m, typename Vec<N>::D v) {
  return m < v ? v : m;
}
template <int N>
GT_INLINE void Spill(const typename Vec<N>::D* v, double* lanes) {
  for (int k = 0; k < kSumLanes / N; ++k) {
    for (int j = 0; j < N; ++j) lanes[N * k + j] = v[k][j];
  }
}

// One block of n elements: a.a, a.b, b.b, then against the block's own scale s the residual, error, maximum and
// cross term (metrics.h FullSums). No per-element branch: non-finite values are counted in another pass only when
// they made a sum non-finite.
template <int N, typename A, typename B>
BlockSums SumBlock(const A* a_in, const B* b_in, int64_t n) {
  using D = typename Vec<N>::D;
  constexpr int kVecs = kSumLanes / N;
  BlockSums out;
  double aa_l[kSumLanes] = {}, ab_l[kSumLanes] = {}, bb_l[kSumLanes] = {};
  const int64_t full = n - n % kSumLanes;
  {
    D aa[kVecs] = {}, ab[kVecs] = {}, bb[kVecs] = {};
    for (int64_t i = 0; i < full; i += kSumLanes) {
      for (int k = 0; k < kVecs; ++k) {
        const D x = Load<N>(a_in + i + N * k), y = Load<N>(b_in + i + N * k);
        aa[k] += x * x;
        ab[k] += x * y;
        bb[k] += y * y;
      }
    }
    Spill<N>(aa, aa_l), Spill<N>(ab, ab_l), Spill<N>(bb, bb_l);
  }
  for (int64_t i = full; i < n; ++i) {
    const double x = a_in[i], y = b_in[i];
    aa_l[i - full] += x * x;
    ab_l[i - full] += x * y;
    bb_l[i - full] += y * y;
  }
  out.aa = LaneSum(aa_l), out.ab = LaneSum(ab_l), out.bb = LaneSum(bb_l);
  if (!std::isfinite(out.aa) || !std::isfinite(out.bb)) {
    for (int64_t i = 0; i < n; ++i) {
      out.nonfinite_a += !std::isfinite(static_cast<double>(a_in[i]));
      out.nonfinite_b += !std::isfinite(static_cast<double>(b_in[i]));
    }
  }
  // Second pass: residual against this block's own scale, error and its maximum.
  double res_l[kSumLanes] = {}, err_l[kSumLanes] = {}, max_l[kSumLanes] = {}, cross_l[kSumLanes] = {};
  const double s = out.aa > 0 ? out.ab / out.aa : 0;
  {
    const D sv = D{} + s;
    D res[kVecs] = {}, err[kVecs] = {}, mx[kVecs] = {}, cross[kVecs] = {};
    for (int64_t i = 0; i < full; i += kSumLanes) {
      for (int k = 0; k < kVecs; ++k) {
        const D x = Load<N>(a_in + i + N * k), y = Load<N>(b_in + i + N * k);
        const D r = y - sv * x, e = y - x;
        res[k] += r * r;
        err[k] += e * e;
        cross[k] += x * r;
        mx[k] = Max<N>(mx[k], Abs<N>(e));
      }
    }
    Spill<N>(res, res_l), Spill<N>(err, err_l), Spill<N>(mx, max_l), Spill<N>(cross, cross_l);
  }
  for (int64_t i = full; i < n; ++i) {
    const int l = static_cast<int>(i - full);
    const double x = a_in[i], y = b_in[i];
    const double r = y - s * x, e = y - x;
    res_l[l] += r * r;
    err_l[l] += e * e;
    cross_l[l] += x * r;
    max_l[l] = std::max(max_l[l], std::fabs(e));  // NaN never wins, as in the vectors
  }
  out.scale = s;
  out.res2 = LaneSum(res_l);
  out.cross = LaneSum(cross_l);
  out.err2 = LaneSum(err_l);
  out.max_abs = *std::max_element(max_l, max_l + kSumLanes);
  return out;
}

#undef GT_INLINE

}  // namespace
}  // namespace gradtrace::diff
