// The stats kernel's body (moments.h), written once for two vector widths:
// the baseline build (moments.cc, 16-byte vectors: SSE2 on x86-64, NEON on
// ARM) and the AVX2 build (moments_avx2.cc, 32-byte vectors, compiled with
// -mavx2 and called only on CPUs that have it). Both put element i in lane
// i % 8 and add in the same order, so they give the same bits.
//
// Include only from those two files. Everything here has internal linkage on
// purpose: each file keeps its own copy compiled for its own instruction set
// (a shared inline function would let the linker keep the AVX2 copy for the
// baseline path, which then faults on a CPU without AVX2).
#pragma once

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>

#include "dtype.h"
#include "moments.h"

namespace gradtrace {
namespace {  // NOLINT(build/namespaces): one copy per instruction set, see above

static_assert(std::endian::native == std::endian::little, "the trace format is little-endian; so is this code");

typedef float F32x4 __attribute__((vector_size(16)));
typedef int32_t I32x4 __attribute__((vector_size(16)));
typedef uint16_t U16x4 __attribute__((vector_size(8)));

// The kernel's helpers must inline into its loop (GCC otherwise returns the
// vectors through memory).
#define GT_INLINE [[gnu::always_inline]] inline

// Vector types of N doubles (N = 2: 16 bytes, N = 4: 32 bytes).
template <int N>
struct Lanes;
template <>
struct Lanes<2> {
  typedef double F64 __attribute__((vector_size(16)));
  typedef int64_t I64 __attribute__((vector_size(16)));
  // Four floats widened exactly, into out[0] (elements 0, 1) and out[1] (2, 3).
  GT_INLINE static void Widen(F32x4 f, F64* out) {
    out[0] = __builtin_convertvector(__builtin_shufflevector(f, f, 0, 1), F64);
    out[1] = __builtin_convertvector(__builtin_shufflevector(f, f, 2, 3), F64);
  }
};
template <>
struct Lanes<4> {
  typedef double F64 __attribute__((vector_size(32)));
  typedef int64_t I64 __attribute__((vector_size(32)));
  GT_INLINE static void Widen(F32x4 f, F64* out) { out[0] = __builtin_convertvector(f, F64); }
};

GT_INLINE I32x4 Load16x4(const uint8_t* p) {
  U16x4 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, I32x4);
}

// Four consecutive elements as their exact fp32 value (the 16-bit formats and fp32).
template <pb::DType T>
F32x4 Load4AsFloat(const uint8_t* p);

template <>
GT_INLINE F32x4 Load4AsFloat<pb::FP32>(const uint8_t* p) {
  F32x4 f;
  std::memcpy(&f, p, sizeof f);
  return f;
}

template <>
GT_INLINE F32x4 Load4AsFloat<pb::BF16>(const uint8_t* p) {
  return std::bit_cast<F32x4>(Load16x4(p) << 16);  // bf16 is the top half of an fp32
}

// fp16 to fp32 bits, exact and branch-free: rebias the exponent of normals,
// convert subnormals (man * 2^-24) as integers, keep Inf/NaN payloads.
template <>
GT_INLINE F32x4 Load4AsFloat<pb::FP16>(const uint8_t* p) {
  const I32x4 h = Load16x4(p);
  const I32x4 em = h & 0x7fff;
  const I32x4 normal = (em << 13) + ((127 - 15) << 23);
  const I32x4 sub = std::bit_cast<I32x4>(__builtin_convertvector(em, F32x4) * 0x1p-24f);
  const I32x4 special = (em << 13) | 0x7f800000;
  const I32x4 is_sub = em < 0x400, is_special = em >= 0x7c00;  // all ones where true
  const I32x4 bits = (normal & ~(is_sub | is_special)) | (sub & is_sub) | (special & is_special) | ((h & 0x8000) << 16);
  return std::bit_cast<F32x4>(bits);
}

// Loaders: four consecutive elements widened to double, into 4 / N vectors.
template <int N, pb::DType T>
struct LoadVector {
  GT_INLINE void operator()(const uint8_t* p, typename Lanes<N>::F64* out) const {
    Lanes<N>::Widen(Load4AsFloat<T>(p), out);
  }
};
template <int N>
struct LoadVector<N, pb::FP64> {
  GT_INLINE void operator()(const uint8_t* p, typename Lanes<N>::F64* out) const { std::memcpy(out, p, 32); }
};

// Any other format of the dtype table (W bytes per element): each element widened by ElementToDouble,
// into the same lanes, so its sums follow the documented order too.
template <int N, int64_t W>
struct LoadEach {
  pb::DType dtype;
  GT_INLINE void operator()(const uint8_t* p, typename Lanes<N>::F64* out) const {
    const double v[4] = {ElementToDouble(dtype, p), ElementToDouble(dtype, p + W), ElementToDouble(dtype, p + 2 * W),
                         ElementToDouble(dtype, p + 3 * W)};
    std::memcpy(out, v, sizeof v);
  }
};

constexpr double kMax = std::numeric_limits<double>::max();

// Per-lane sums of one chunk (lane l of 8 is element l % N of vector l / N), and the block's extremes.
template <int N>
struct Acc {
  using F64 = typename Lanes<N>::F64;
  using I64 = typename Lanes<N>::I64;
  static constexpr int kVectors = 8 / N;
  F64 sum[kVectors] = {}, sq[kVectors] = {};
  F64 amax = {};
  I64 finite = {};  // minus the number of finite elements
};

// |x| <= DBL_MAX is false exactly for NaN and +-Inf (which widening keeps).
template <int N>
GT_INLINE void Add(Acc<N>& a, int j, typename Lanes<N>::F64 x) {
  using F64 = typename Lanes<N>::F64;
  using I64 = typename Lanes<N>::I64;
  const F64 abs = std::bit_cast<F64>(std::bit_cast<I64>(x) & 0x7fffffffffffffffll);
  const I64 fin = abs <= kMax;
  const F64 v = std::bit_cast<F64>(std::bit_cast<I64>(x) & fin);  // non-finite -> +0.0
  a.sum[j] += v;
  a.sq[j] += v * v;
  const F64 m = std::bit_cast<F64>(std::bit_cast<I64>(abs) & fin);
  const I64 gt = m > a.amax;  // neither is NaN here
  a.amax = std::bit_cast<F64>((std::bit_cast<I64>(m) & gt) | (std::bit_cast<I64>(a.amax) & ~gt));
  a.finite += fin;
}

template <int N, int64_t W, typename Load>
GT_INLINE void AddEight(Acc<N>& a, const uint8_t* p, Load load) {
  typename Lanes<N>::F64 v[8 / N];
  load(p, v);
  load(p + 4 * W, v + 4 / N);
  for (int j = 0; j < 8 / N; ++j) Add(a, j, v[j]);
}

GT_INLINE void AddCompensated(double& s, double& c, double x) {
  const double t = s + x;
  // Once the sum overflows, the correction would be Inf - Inf = NaN and turn
  // an honest Inf into NaN: stop correcting.
  if (std::isfinite(t)) c += std::fabs(s) >= std::fabs(x) ? (s - t) + x : (x - t) + s;
  s = t;
}

// Lanes 0..7 to one double, in a fixed tree: ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)).
template <int N>
GT_INLINE double Fold(const typename Lanes<N>::F64 (&v)[8 / N]) {
  double l[8];
  std::memcpy(l, v, sizeof l);
  return ((l[0] + l[4]) + (l[1] + l[5])) + ((l[2] + l[6]) + (l[3] + l[7]));
}

// One block of W-byte elements, each four read by `load`.
template <int N, int64_t W, typename Load>
Moments BlockMomentsOf(const uint8_t* p, int64_t n, Load load) {
  Moments m;
  Acc<N> acc;
  int64_t padding = 0;
  for (int64_t c = 0; c < n; c += kMomentsChunk) {
    const int64_t len = std::min(kMomentsChunk, n - c);
    const uint8_t* q = p + c * W;
    for (int j = 0; j < 8 / N; ++j) acc.sum[j] = acc.sq[j] = typename Lanes<N>::F64{};
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) AddEight<N, W>(acc, q + i * W, load);
    if (i < len) {  // zero-padded tail: +0.0 changes no sum and no maximum
      uint8_t tail[8 * W] = {};
      std::memcpy(tail, q + i * W, static_cast<size_t>((len - i) * W));
      AddEight<N, W>(acc, tail, load);
      padding += 8 - (len - i);
    }
    AddCompensated(m.sum, m.sum_c, Fold<N>(acc.sum));
    AddCompensated(m.sum_sq, m.sum_sq_c, Fold<N>(acc.sq));
  }
  int64_t finite = 0;
  for (int k = 0; k < N; ++k) {
    finite -= acc.finite[k];
    m.abs_max = std::max(m.abs_max, acc.amax[k]);
  }
  m.count = finite - padding;
  m.nonfinite = n - m.count;
  return m;
}

// One block of a dtype with a vector loader; `*handled` false for any other dtype.
template <int N>
Moments VectorBlockMoments(pb::DType dtype, const uint8_t* p, int64_t count, bool* handled) {
  *handled = true;
  switch (dtype) {
    case pb::FP32:
      return BlockMomentsOf<N, 4>(p, count, LoadVector<N, pb::FP32>{});
    case pb::BF16:
      return BlockMomentsOf<N, 2>(p, count, LoadVector<N, pb::BF16>{});
    case pb::FP16:
      return BlockMomentsOf<N, 2>(p, count, LoadVector<N, pb::FP16>{});
    case pb::FP64:
      return BlockMomentsOf<N, 8>(p, count, LoadVector<N, pb::FP64>{});
    default:
      *handled = false;
      return Moments();
  }
}

}  // namespace
}  // namespace gradtrace
