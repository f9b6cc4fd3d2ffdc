// The one-pass stats kernel against the element-by-element implementation it
// replaced (kept here as the reference): counts and abs-max exact, sums within
// the bound stated in moments.h.
#include "moments.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "slice_codec.h"

namespace gradtrace {
namespace {

// The pre-kernel FillStats: Neumaier-compensated sums in element order.
pb::StatsPayload ReferenceStats(pb::DType dtype, const uint8_t* p, int64_t count) {
  const size_t w = DTypeSize(dtype);
  double sum = 0, sum_c = 0, sq = 0, sq_c = 0, abs_max = 0;
  int64_t finite = 0, nonfinite = 0;
  auto add = [](double& s, double& c, double x) {
    const double t = s + x;
    if (std::isfinite(t)) c += std::fabs(s) >= std::fabs(x) ? (s - t) + x : (x - t) + s;
    s = t;
  };
  for (int64_t i = 0; i < count; ++i) {
    const double v = ElementToDouble(dtype, p + i * w);
    if (!std::isfinite(v)) {
      ++nonfinite;
      continue;
    }
    ++finite;
    add(sum, sum_c, v);
    add(sq, sq_c, v * v);
    abs_max = std::fmax(abs_max, std::fabs(v));
  }
  pb::StatsPayload out;
  out.set_count(finite);
  out.set_sum(sum + sum_c);
  out.set_sum_sq(sq + sq_c);
  out.set_abs_max(abs_max);
  out.set_nonfinite(nonfinite);
  return out;
}

// n elements of N(0, scale) in `dtype`, with every 97th a NaN or +-Inf when `specials`.
std::string RandomBytes(pb::DType dtype, int64_t n, double scale, bool specials, uint32_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<double> d(0.0, scale);
  const size_t w = DTypeSize(dtype);
  std::string out(n * w, '\0');
  const double kSpecial[] = {std::nan(""), INFINITY, -INFINITY};
  for (int64_t i = 0; i < n; ++i) {
    const double v = specials && i % 97 == 13 ? kSpecial[(i / 97) % 3] : d(rng);
    DoubleToElement(dtype, v, reinterpret_cast<uint8_t*>(out.data()) + i * w);
  }
  return out;
}

double SumAbs(pb::DType dtype, const std::string& bytes, bool squares) {
  const size_t w = DTypeSize(dtype);
  double s = 0;
  for (size_t i = 0; i < bytes.size() / w; ++i) {
    const double v = ElementToDouble(dtype, reinterpret_cast<const uint8_t*>(bytes.data()) + i * w);
    if (std::isfinite(v)) s += squares ? v * v : std::fabs(v);
  }
  return s;
}

void ExpectWithinBound(pb::DType dtype, const std::string& bytes, const std::string& what) {
  const int64_t n = static_cast<int64_t>(bytes.size() / DTypeSize(dtype));
  const pb::StatsPayload ref = ReferenceStats(dtype, reinterpret_cast<const uint8_t*>(bytes.data()), n);
  pb::StatsPayload got;
  SliceMoments(dtype, bytes.data(), n).Fill(&got);
  EXPECT_EQ(ref.count(), got.count()) << what;
  EXPECT_EQ(ref.nonfinite(), got.nonfinite()) << what;
  EXPECT_EQ(ref.abs_max(), got.abs_max()) << what;
  // moments.h: |sum - exact| <= 2^-47 sum|v| + 2^-52 |exact|; the reference is
  // itself within 2^-52 |exact| (Neumaier), hence the 2^-51.
  const double sum_bound = std::ldexp(SumAbs(dtype, bytes, false), -47) + std::ldexp(std::fabs(ref.sum()), -51);
  const double sq_bound = std::ldexp(SumAbs(dtype, bytes, true), -46);
  EXPECT_LE(std::fabs(got.sum() - ref.sum()), sum_bound) << what << " sum " << got.sum() << " vs " << ref.sum();
  EXPECT_LE(std::fabs(got.sum_sq() - ref.sum_sq()), sq_bound) << what;
}

void ExpectSameBits(const Moments& a, const Moments& b, const std::string& what) {
  EXPECT_EQ(a.count, b.count) << what;
  EXPECT_EQ(a.nonfinite, b.nonfinite) << what;
  EXPECT_EQ(std::bit_cast<uint64_t>(a.sum), std::bit_cast<uint64_t>(b.sum)) << what;
  EXPECT_EQ(std::bit_cast<uint64_t>(a.sum_c), std::bit_cast<uint64_t>(b.sum_c)) << what;
  EXPECT_EQ(std::bit_cast<uint64_t>(a.sum_sq), std::bit_cast<uint64_t>(b.sum_sq)) << what;
  EXPECT_EQ(std::bit_cast<uint64_t>(a.sum_sq_c), std::bit_cast<uint64_t>(b.sum_sq_c)) << what;
  EXPECT_EQ(a.abs_max, b.abs_max) << what;
}

TEST(Moments, MatchesTheElementwiseReferenceForEveryDtypeAndSize) {
  // Sizes around the chunk (256), the 8-lane group and the block (65536) edges.
  const int64_t sizes[] = {0, 1, 7, 8, 9, 255, 256, 257, 1000, 65535, 65536, 65537, 200003};
  for (pb::DType t : {pb::FP32, pb::BF16, pb::FP16, pb::FP64}) {
    for (int64_t n : sizes) {
      for (bool specials : {false, true}) {
        const std::string what = std::string(DTypeName(t)) + " n=" + std::to_string(n) + (specials ? " +specials" : "");
        ExpectWithinBound(t, RandomBytes(t, n, t == pb::FP16 ? 1.0 : 1e-3, specials, 42 + n), what);
      }
    }
  }
}

// A dtype added to the table without a vector kernel takes the element-wise path: it must follow the
// documented order, so it gives the vector kernels' very bits on the dtypes that have one.
TEST(Moments, ElementwisePathGivesTheVectorKernelsBits) {
  for (pb::DType t : {pb::FP32, pb::BF16, pb::FP16, pb::FP64}) {
    for (int64_t n : {0, 1, 7, 8, 9, 255, 256, 257, 1000, 65536}) {
      const std::string bytes = RandomBytes(t, n, t == pb::FP16 ? 1.0 : 1e-3, true, 7 + n);
      const Moments a = BlockMoments(t, bytes.data(), n), b = BlockMomentsElementwise(t, bytes.data(), n);
      const std::string what = std::string(DTypeName(t)) + " n=" + std::to_string(n);
      ExpectSameBits(a, b, what);
    }
  }
}

// The AVX2 build of the kernel (32-byte vectors) keeps the documented lanes and order: the same bits as
// the baseline build, specials included. On a CPU with AVX2 BlockMoments must have dispatched to it.
TEST(Moments, Avx2KernelGivesTheBaselineBits) {
#if defined(__x86_64__)
  EXPECT_EQ(MomentsKernelIsAvx2(), static_cast<bool>(__builtin_cpu_supports("avx2")));
#endif
  if (!MomentsKernelIsAvx2()) std::fprintf(stderr, "note: no AVX2 on this CPU; BlockMoments is the baseline\n");
  for (pb::DType t : {pb::FP32, pb::BF16, pb::FP16, pb::FP64}) {
    for (int64_t n : {0, 1, 7, 8, 9, 255, 256, 257, 1000, 65535, 65536}) {
      for (bool specials : {false, true}) {
        const std::string bytes = RandomBytes(t, n, t == pb::FP16 ? 1.0 : 1e-3, specials, 11 + n);
        const Moments a = BlockMoments(t, bytes.data(), n), b = BlockMomentsBaseline(t, bytes.data(), n);
        const std::string what = std::string(DTypeName(t)) + " n=" + std::to_string(n) + (specials ? " +specials" : "");
        ExpectSameBits(a, b, what);
      }
    }
  }
}

TEST(Moments, OffsetMeanAndCancellationStayWithinBound) {
  // Large mean, small spread: sum_sq is dominated by the mean and the sum
  // by cancellation-free terms; a mean-zero run tests cancellation.
  std::vector<float> v(100000);
  for (size_t i = 0; i < v.size(); ++i) v[i] = 1000.0f + static_cast<float>(i % 17) * 1e-3f;
  ExpectWithinBound(pb::FP32, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4), "offset");
  for (size_t i = 0; i < v.size(); ++i) v[i] = (i % 2 ? 1.0f : -1.0f) * (1.0f + static_cast<float>(i) * 1e-7f);
  ExpectWithinBound(pb::FP32, std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4), "alternating");
}

// Each 16-bit pattern alone: the inline widening must agree with
// ElementToDouble bit for bit (subnormals, Inf, NaN payloads, -0).
TEST(Moments, EveryFp16AndBf16PatternWidensExactly) {
  for (pb::DType t : {pb::FP16, pb::BF16}) {
    for (uint32_t b = 0; b < 65536; ++b) {
      const uint16_t bits = static_cast<uint16_t>(b);
      const double v = ElementToDouble(t, reinterpret_cast<const uint8_t*>(&bits));
      const Moments m = SliceMoments(t, &bits, 1);
      if (!std::isfinite(v)) {
        ASSERT_EQ(m.nonfinite, 1) << DTypeName(t) << " 0x" << std::hex << b;
        continue;
      }
      ASSERT_EQ(m.count, 1) << DTypeName(t) << " 0x" << std::hex << b;
      ASSERT_EQ(m.sum + m.sum_c, v) << DTypeName(t) << " 0x" << std::hex << b;
      ASSERT_EQ(m.abs_max, std::fabs(v)) << DTypeName(t) << " 0x" << std::hex << b;
    }
  }
}

// The order is a function of the data alone: blocks merged in order, as a
// parallel producer does, give the same bits as SliceMoments.
TEST(Moments, BlocksMergedInOrderEqualTheWholeSlice) {
  const std::string bytes = RandomBytes(pb::FP32, 3 * kMomentsBlock + 123, 1e-2, true, 7);
  const int64_t n = static_cast<int64_t>(bytes.size() / 4);
  std::vector<Moments> blocks;
  for (int64_t b = 0; b < n; b += kMomentsBlock) {
    blocks.push_back(BlockMoments(pb::FP32, bytes.data() + b * 4, std::min(kMomentsBlock, n - b)));
  }
  Moments merged;
  for (const Moments& m : blocks) merged.Merge(m);
  pb::StatsPayload a, b;
  merged.Fill(&a);
  SliceMoments(pb::FP32, bytes.data(), n).Fill(&b);
  EXPECT_EQ(a.SerializeAsString(), b.SerializeAsString());
}

TEST(Moments, Fp64OverflowGivesInfNotNan) {
  std::vector<double> v(1000, 1e300);
  const Moments m = SliceMoments(pb::FP64, v.data(), static_cast<int64_t>(v.size()));
  pb::StatsPayload s;
  m.Fill(&s);
  EXPECT_DOUBLE_EQ(s.sum(), 1e303);
  EXPECT_EQ(s.sum_sq(), INFINITY);
  EXPECT_EQ(s.count(), 1000);
}

}  // namespace
}  // namespace gradtrace
