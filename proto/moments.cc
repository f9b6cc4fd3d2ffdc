// The stats kernel. GCC/Clang vector extensions fix the lanes whatever the
// target's SIMD width, so both the speed and the summation order hold without
// -ffast-math and without relying on the auto-vectorizer.
#include "moments.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>

#include "dtype.h"

namespace gradtrace {
namespace {

static_assert(std::endian::native == std::endian::little, "the trace format is little-endian; so is this code");

// Two-lane double vectors: one SSE2 register on baseline x86-64 (NEON on ARM).
typedef double F64x2 __attribute__((vector_size(16)));
typedef int64_t I64x2 __attribute__((vector_size(16)));
typedef float F32x4 __attribute__((vector_size(16)));
typedef int32_t I32x4 __attribute__((vector_size(16)));
typedef uint16_t U16x4 __attribute__((vector_size(8)));

// The kernel's helpers must inline into its loop (GCC otherwise returns the
// vectors through memory).
#define GT_INLINE [[gnu::always_inline]] inline

// Four consecutive elements widened exactly to double: lanes {0,1} and {2,3}.
struct Quad {
  F64x2 lo, hi;
};

GT_INLINE Quad Widen(F32x4 f) {
  return {__builtin_convertvector(__builtin_shufflevector(f, f, 0, 1), F64x2),
          __builtin_convertvector(__builtin_shufflevector(f, f, 2, 3), F64x2)};
}

GT_INLINE I32x4 Load16x4(const uint8_t* p) {
  U16x4 h;
  std::memcpy(&h, p, sizeof h);
  return __builtin_convertvector(h, I32x4);
}

template <pb::DType T>
Quad Load4(const uint8_t* p);

template <>
GT_INLINE Quad Load4<pb::FP32>(const uint8_t* p) {
  F32x4 f;
  std::memcpy(&f, p, sizeof f);
  return Widen(f);
}

template <>
GT_INLINE Quad Load4<pb::BF16>(const uint8_t* p) {
  return Widen(std::bit_cast<F32x4>(Load16x4(p) << 16));  // bf16 is the top half of an fp32
}

// fp16 to fp32 bits, exact and branch-free: rebias the exponent of normals,
// convert subnormals (man * 2^-24) as integers, keep Inf/NaN payloads.
template <>
GT_INLINE Quad Load4<pb::FP16>(const uint8_t* p) {
  const I32x4 h = Load16x4(p);
  const I32x4 em = h & 0x7fff;
  const I32x4 normal = (em << 13) + ((127 - 15) << 23);
  const I32x4 sub = std::bit_cast<I32x4>(__builtin_convertvector(em, F32x4) * 0x1p-24f);
  const I32x4 special = (em << 13) | 0x7f800000;
  const I32x4 is_sub = em < 0x400, is_special = em >= 0x7c00;  // all ones where true
  const I32x4 bits = (normal & ~(is_sub | is_special)) | (sub & is_sub) | (special & is_special) | ((h & 0x8000) << 16);
  return Widen(std::bit_cast<F32x4>(bits));
}

template <>
GT_INLINE Quad Load4<pb::FP64>(const uint8_t* p) {
  Quad q;
  std::memcpy(&q, p, sizeof q);
  return q;
}

constexpr double kMax = std::numeric_limits<double>::max();

// Per-lane sums of one chunk, and the block's extremes.
struct Acc {
  F64x2 sum[4] = {}, sq[4] = {};
  F64x2 amax = {};
  I64x2 finite = {};  // minus the number of finite elements
};

// |x| <= DBL_MAX is false exactly for NaN and +-Inf (which widening keeps).
GT_INLINE void Add(Acc& a, int lane, F64x2 x, F64x2& abs_out, I64x2& fin_out) {
  const F64x2 abs = std::bit_cast<F64x2>(std::bit_cast<I64x2>(x) & 0x7fffffffffffffffll);
  const I64x2 fin = abs <= kMax;
  const F64x2 v = std::bit_cast<F64x2>(std::bit_cast<I64x2>(x) & fin);  // non-finite -> +0.0
  a.sum[lane] += v;
  a.sq[lane] += v * v;
  abs_out = std::bit_cast<F64x2>(std::bit_cast<I64x2>(abs) & fin);
  fin_out = fin;
}

GT_INLINE F64x2 Max(F64x2 a, F64x2 b) {  // neither is NaN here
  const I64x2 gt = a > b;
  return std::bit_cast<F64x2>((std::bit_cast<I64x2>(a) & gt) | (std::bit_cast<I64x2>(b) & ~gt));
}

// The four elements at p widened to double, for the formats with a vector path above.
template <pb::DType T>
struct LoadVector {
  GT_INLINE Quad operator()(const uint8_t* p) const { return Load4<T>(p); }
};

// Any other format of the dtype table (W bytes per element): each element widened by ElementToDouble,
// into the same lanes, so its sums follow the documented order too.
template <int64_t W>
struct LoadEach {
  pb::DType dtype;
  GT_INLINE Quad operator()(const uint8_t* p) const {
    return {F64x2{ElementToDouble(dtype, p), ElementToDouble(dtype, p + W)},
            F64x2{ElementToDouble(dtype, p + 2 * W), ElementToDouble(dtype, p + 3 * W)}};
  }
};

template <int64_t W, typename Load>
GT_INLINE void AddEight(Acc& a, const uint8_t* p, Load load) {
  const Quad q0 = load(p), q1 = load(p + 4 * W);
  F64x2 m0, m1, m2, m3;
  I64x2 f0, f1, f2, f3;
  Add(a, 0, q0.lo, m0, f0);
  Add(a, 1, q0.hi, m1, f1);
  Add(a, 2, q1.lo, m2, f2);
  Add(a, 3, q1.hi, m3, f3);
  a.amax = Max(a.amax, Max(Max(m0, m1), Max(m2, m3)));
  a.finite += (f0 + f1) + (f2 + f3);
}

void AddCompensated(double& s, double& c, double x) {
  const double t = s + x;
  // Once the sum overflows, the correction would be Inf - Inf = NaN and turn
  // an honest Inf into NaN: stop correcting.
  if (std::isfinite(t)) c += std::fabs(s) >= std::fabs(x) ? (s - t) + x : (x - t) + s;
  s = t;
}

// Lanes 0..7 to one double, in a fixed tree: ((l0+l4)+(l1+l5)) + ((l2+l6)+(l3+l7)).
double Fold(const F64x2 (&v)[4]) {
  const F64x2 s02 = v[0] + v[2], s13 = v[1] + v[3];
  return (s02[0] + s02[1]) + (s13[0] + s13[1]);
}

// One block of W-byte elements, each four read by `load`.
template <int64_t W, typename Load>
Moments BlockMomentsOf(const uint8_t* p, int64_t n, Load load) {
  Moments m;
  Acc acc;
  int64_t padding = 0;
  for (int64_t c = 0; c < n; c += kMomentsChunk) {
    const int64_t len = std::min(kMomentsChunk, n - c);
    const uint8_t* q = p + c * W;
    for (int l = 0; l < 4; ++l) acc.sum[l] = acc.sq[l] = F64x2{};
    int64_t i = 0;
    for (; i + 8 <= len; i += 8) AddEight<W>(acc, q + i * W, load);
    if (i < len) {  // zero-padded tail: +0.0 changes no sum and no maximum
      uint8_t tail[8 * W] = {};
      std::memcpy(tail, q + i * W, static_cast<size_t>((len - i) * W));
      AddEight<W>(acc, tail, load);
      padding += 8 - (len - i);
    }
    AddCompensated(m.sum, m.sum_c, Fold(acc.sum));
    AddCompensated(m.sum_sq, m.sum_sq_c, Fold(acc.sq));
  }
  m.count = -(acc.finite[0] + acc.finite[1]) - padding;
  m.nonfinite = n - m.count;
  m.abs_max = std::max(acc.amax[0], acc.amax[1]);
  return m;
}

}  // namespace

Moments BlockMomentsElementwise(pb::DType dtype, const void* data, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (DTypeSize(dtype)) {
    case 1:
      return BlockMomentsOf<1>(p, n, LoadEach<1>{dtype});
    case 2:
      return BlockMomentsOf<2>(p, n, LoadEach<2>{dtype});
    case 4:
      return BlockMomentsOf<4>(p, n, LoadEach<4>{dtype});
    case 8:
      return BlockMomentsOf<8>(p, n, LoadEach<8>{dtype});
    default: {
      Moments m;  // unknown dtype: nothing is finite (the writer refuses such slices anyway)
      m.nonfinite = n;
      return m;
    }
  }
}

void Moments::Merge(const Moments& o) {
  count += o.count;
  nonfinite += o.nonfinite;
  AddCompensated(sum, sum_c, o.sum);
  if (std::isfinite(sum)) sum_c += o.sum_c;
  AddCompensated(sum_sq, sum_sq_c, o.sum_sq);
  if (std::isfinite(sum_sq)) sum_sq_c += o.sum_sq_c;
  abs_max = std::max(abs_max, o.abs_max);
}

void Moments::Fill(pb::StatsPayload* out) const {
  out->set_count(count);
  out->set_sum(sum + sum_c);
  out->set_sum_sq(sum_sq + sum_sq_c);
  out->set_abs_max(abs_max);
  out->set_nonfinite(nonfinite);
}

Moments BlockMoments(pb::DType dtype, const void* data, int64_t count) {
  const auto* p = static_cast<const uint8_t*>(data);
  switch (dtype) {
    case pb::FP32:
      return BlockMomentsOf<4>(p, count, LoadVector<pb::FP32>{});
    case pb::BF16:
      return BlockMomentsOf<2>(p, count, LoadVector<pb::BF16>{});
    case pb::FP16:
      return BlockMomentsOf<2>(p, count, LoadVector<pb::FP16>{});
    case pb::FP64:
      return BlockMomentsOf<8>(p, count, LoadVector<pb::FP64>{});
    default:
      return BlockMomentsElementwise(dtype, p, count);
  }
}

Moments SliceMoments(pb::DType dtype, const void* data, int64_t count) {
  const auto* p = static_cast<const uint8_t*>(data);
  const size_t w = DTypeSize(dtype);
  Moments total;
  for (int64_t b = 0; b < count; b += kMomentsBlock) {
    total.Merge(BlockMoments(dtype, p + b * w, std::min(kMomentsBlock, count - b)));
  }
  return total;
}

}  // namespace gradtrace
