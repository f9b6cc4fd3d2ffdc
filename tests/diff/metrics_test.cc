#include "compare/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "compare/block_sums_kernel.h"

namespace gradtrace::diff {
namespace {

std::vector<double> Ramp(int n) {
  std::vector<double> v(n);
  for (int i = 0; i < n; ++i) v[i] = std::sin(0.37 * i + 0.1) * (1 + i % 5);
  return v;
}

TEST(Metrics, ExactMultipleHasZeroResidual) {
  auto a = Ramp(1000);
  std::vector<double> b(a.size());
  for (size_t i = 0; i < a.size(); ++i) b[i] = 3 * a[i];
  Metrics m = CompareValues(a.data(), b.data(), 1000, Basis::kFull);
  EXPECT_DOUBLE_EQ(m.scale, 3.0);
  EXPECT_LT(m.residual, 1e-15);
  EXPECT_NEAR(m.cosine, 1.0, 1e-15);
  EXPECT_NEAR(m.rel_error, 2.0 / 3.0, 1e-15);  // ||3a - a|| / ||3a||
  EXPECT_EQ(Classify(m, 1e-6), Verdict::kScaled);
}

TEST(Metrics, IdenticalMatches) {
  auto a = Ramp(100);
  Metrics m = CompareValues(a.data(), a.data(), 100, Basis::kFull);
  EXPECT_EQ(m.rel_error, 0);
  EXPECT_EQ(m.max_abs_error, 0);
  EXPECT_EQ(Classify(m, 1e-6), Verdict::kMatch);
}

TEST(Metrics, TinyResidualIsMeasuredNotCancelled) {
  // A one-pass formula (bb - ab^2/aa) loses everything below ~1e-8.
  auto a = Ramp(1000);
  std::vector<double> b(a.size());
  for (size_t i = 0; i < a.size(); ++i) b[i] = 2 * a[i] + (i == 7 ? 1e-12 : 0);
  Metrics m = CompareValues(a.data(), b.data(), 1000, Basis::kFull);
  EXPECT_GT(m.residual, 1e-15);
  EXPECT_LT(m.residual, 1e-12);
}

TEST(Metrics, OrthogonalIsMismatch) {
  std::vector<double> a = {1, 0, 1, 0}, b = {0, 1, 0, 1};
  Metrics m = CompareValues(a.data(), b.data(), 4, Basis::kFull);
  EXPECT_EQ(m.scale, 0);
  EXPECT_EQ(m.cosine, 0);
  EXPECT_DOUBLE_EQ(m.residual, 1.0);
  EXPECT_EQ(Classify(m, 1e-3), Verdict::kMismatch);
}

TEST(Metrics, NegativeScale) {
  std::vector<double> a = {1, -2, 3}, b = {-1, 2, -3};
  Metrics m = CompareValues(a.data(), b.data(), 3, Basis::kFull);
  EXPECT_DOUBLE_EQ(m.scale, -1.0);
  EXPECT_EQ(Classify(m, 1e-6), Verdict::kScaled);
}

TEST(Metrics, NonfiniteWins) {
  std::vector<double> a = {1, 2, 3}, b = {1, NAN, 3};
  Metrics m = CompareValues(a.data(), b.data(), 3, Basis::kFull);
  EXPECT_EQ(m.nonfinite_b, 1);
  EXPECT_EQ(Classify(m, 1), Verdict::kNonfinite);
}

// Issue 42: a NaN against a finite value showed max_abs_error 0 (the kernel skips non-finite elements).
TEST(Metrics, MaxAbsErrorIsNaNWithANonfiniteElement) {
  std::vector<double> a = {1, 2, 3}, b = {1, NAN, 3};
  EXPECT_TRUE(std::isnan(CompareValues(a.data(), b.data(), 3, Basis::kFull).max_abs_error));
  std::vector<double> c = {1, 2, 3}, d = {1, 2.5, INFINITY};
  EXPECT_TRUE(std::isnan(CompareValues(c.data(), d.data(), 3, Basis::kFull).max_abs_error));
  std::vector<double> e = {1, 2.5, 3};
  EXPECT_DOUBLE_EQ(CompareValues(c.data(), e.data(), 3, Basis::kFull).max_abs_error, 0.5);
  Moments ma, mb;
  for (double v : a) ma.Add(v);
  for (double v : b) mb.Add(v);
  EXPECT_TRUE(std::isnan(CompareMoments(ma, mb, false).max_abs_error));
  EXPECT_TRUE(std::isnan(CompareMoments(ma, mb, true).max_abs_error));
  Moments zero, nan_only;
  zero.Add(0);
  nan_only.Add(NAN);
  EXPECT_TRUE(std::isnan(CompareMoments(zero, nan_only, false).max_abs_error));  // A all zero: the early return
}

TEST(Metrics, ZeroAgainstZeroMatchesZeroAgainstNonzeroDoesNot) {
  std::vector<double> z = {0, 0}, o = {1, 0};
  EXPECT_EQ(Classify(CompareValues(z.data(), z.data(), 2, Basis::kFull), 1e-6), Verdict::kMatch);
  EXPECT_EQ(Classify(CompareValues(z.data(), o.data(), 2, Basis::kFull), 1e-6), Verdict::kMismatch);
  EXPECT_EQ(Classify(CompareValues(o.data(), z.data(), 2, Basis::kFull), 1e-6), Verdict::kMismatch);
}

TEST(Metrics, MomentsGiveScaleFromNorms) {
  Moments a, b;
  for (double v : Ramp(500)) {
    a.Add(v);
    b.Add(4 * v);
  }
  Metrics m = CompareMoments(a, b, false);
  EXPECT_NEAR(m.scale, 4.0, 1e-12);
  EXPECT_LT(m.residual, 1e-12);
  EXPECT_TRUE(std::isnan(m.cosine));
  EXPECT_EQ(Classify(m, 1e-6), Verdict::kScaled);
}

TEST(Metrics, MomentsOfDifferentShapesDisagree) {
  Moments a, b;
  auto r = Ramp(500);
  for (size_t i = 0; i < r.size(); ++i) {
    a.Add(r[i]);
    b.Add(i % 2 ? r[i] : -r[i]);
  }
  EXPECT_EQ(Classify(CompareMoments(a, b, false), 1e-6), Verdict::kMismatch);
}

// The absolute floor (tolerance.h): a gradient that is rounding noise on both
// sides passes; anything the floor cannot explain does not.
TEST(Metrics, AbsoluteFloorPassesRoundingNoiseOnly) {
  const int n = 64;
  auto noise = Ramp(n);
  std::vector<double> a(n), b(n);
  for (int i = 0; i < n; ++i) a[i] = 1e-11 * noise[i], b[i] = 1e-11 * noise[(i * 7) % n];  // unrelated noise
  Metrics m = CompareValues(a.data(), b.data(), n, Basis::kFull);
  EXPECT_GT(m.residual, 0.3);
  EXPECT_EQ(Classify(m, 1e-4), Verdict::kMismatch);
  EXPECT_EQ(Classify(m, 1e-4, 3e-8), Verdict::kMatch);
  // Zero in A, noise in B: within the floor.
  std::vector<double> zero(n, 0.0);
  EXPECT_EQ(Classify(CompareValues(zero.data(), b.data(), n, Basis::kFull), 1e-4, 3e-8), Verdict::kMatch);
  // Zero in A, a real gradient in B (1e-6 per element, 30x the floor): still a mismatch.
  std::vector<double> real(n);
  for (int i = 0; i < n; ++i) real[i] = 1e-6 * noise[i];
  EXPECT_EQ(Classify(CompareValues(zero.data(), real.data(), n, Basis::kFull), 1e-4, 3e-8), Verdict::kMismatch);
  // A small real gradient, twice too large: scaled, not hidden by the floor.
  std::vector<double> twice(n);
  for (int i = 0; i < n; ++i) twice[i] = 2 * real[i];
  Metrics s = CompareValues(real.data(), twice.data(), n, Basis::kFull);
  EXPECT_EQ(Classify(s, 1e-4, 3e-8), Verdict::kScaled);
  EXPECT_NEAR(s.scale, 2.0, 1e-12);
  // Stats have no elementwise floor.
  Metrics st = m;
  st.basis = Basis::kStats;
  EXPECT_EQ(Classify(st, 1e-4, 3e-8), Verdict::kMismatch);
}

// Every path gives FullSums its elements in other pieces (whole, windows,
// slices of frames): the results must not depend on them, bit for bit, and
// several blocks must stay as accurate as one two-pass sum (long double here).
TEST(Metrics, FullSumsIsTheSameWhateverThePieces) {
  const int64_t n = 3 * FullSums::kBlock + 123;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> g(0.0f, 1e-3f);
  std::vector<float> a(n), b(n);
  for (int64_t i = 0; i < n; ++i) a[i] = g(rng), b[i] = 4.0f * a[i] + 1e-9f * g(rng);
  const Metrics whole = CompareValues(a.data(), b.data(), n, Basis::kFull);
  std::vector<double> b64(b.begin(), b.end());
  for (int64_t piece : {int64_t{1}, int64_t{100}, FullSums::kBlock - 1, FullSums::kBlock, 5 * FullSums::kBlock}) {
    FullSums sums;
    for (int64_t lo = 0; lo < n; lo += piece) {
      const int64_t m = std::min(piece, n - lo);
      sums.Add(a.data() + lo, b64.data() + lo, m, lo + m == n && piece % 2 == 1);
    }
    const Metrics m = sums.Finish(Basis::kFull);
    EXPECT_EQ(m.scale, whole.scale) << piece;
    EXPECT_EQ(m.residual, whole.residual) << piece;
    EXPECT_EQ(m.cosine, whole.cosine) << piece;
    EXPECT_EQ(m.rel_error, whole.rel_error) << piece;
    EXPECT_EQ(m.max_abs_error, whole.max_abs_error) << piece;
    EXPECT_EQ(m.compared, n) << piece;
  }
  long double aa = 0, ab = 0, bb = 0;
  for (int64_t i = 0; i < n; ++i)
    aa += (long double)a[i] * a[i], ab += (long double)a[i] * b[i], bb += (long double)b[i] * b[i];
  const long double s = ab / aa;
  long double r2 = 0;
  for (int64_t i = 0; i < n; ++i) r2 += (b[i] - s * a[i]) * (b[i] - s * a[i]);
  const double residual = static_cast<double>(std::sqrt(r2 / bb));
  EXPECT_NEAR(whole.scale, static_cast<double>(s), 1e-15);
  // b = 4a but where fp32 rounding kept the planted noise: a residual far below sqrt(double epsilon), which a
  // one-pass formula (bb - 2 s ab + s^2 aa) would cancel to nothing.
  EXPECT_GT(residual, 1e-12);
  EXPECT_LT(residual, 1e-9);
  EXPECT_NEAR(whole.residual, residual, 1e-6 * residual);
}

// The AVX2 build of a block (block_sums_avx2.cc, vectors of 4 doubles) gives the baseline's bits (vectors of 2),
// non-finite values and the tail past the last 8 elements included.
TEST(Metrics, BlockSumsAreTheSameBitsWithAvx2) {
#if GRADTRACE_BLOCK_SUMS_AVX2
  if (!__builtin_cpu_supports("avx2")) GTEST_SKIP() << "no AVX2 on this CPU";
  std::mt19937_64 rng(11);
  std::normal_distribution<double> g(0.0, 1.0);
  for (int64_t n : {int64_t{0}, int64_t{7}, int64_t{8}, int64_t{1001}, FullSums::kBlock}) {
    std::vector<float> a(n), b(n);
    std::vector<double> a64(n), b64(n);
    for (int64_t i = 0; i < n; ++i) {
      a[i] = static_cast<float>(g(rng) * 1e-3), b[i] = static_cast<float>(3 * a[i] + g(rng) * 1e-7);
      a64[i] = g(rng), b64[i] = -a64[i] * 0.5 + g(rng) * 1e-9;
    }
    if (n > 100) a[50] = std::numeric_limits<float>::quiet_NaN(), b64[99] = std::numeric_limits<double>::infinity();
    auto same = [&](const BlockSums& x, const BlockSums& y) {
      for (auto [p, q] : {std::pair{x.aa, y.aa},
                          {x.ab, y.ab},
                          {x.bb, y.bb},
                          {x.scale, y.scale},
                          {x.res2, y.res2},
                          {x.cross, y.cross},
                          {x.err2, y.err2},
                          {x.max_abs, y.max_abs}}) {
        EXPECT_TRUE(std::memcmp(&p, &q, sizeof p) == 0) << n << ": " << p << " vs " << q;
      }
      EXPECT_EQ(x.nonfinite_a, y.nonfinite_a);
      EXPECT_EQ(x.nonfinite_b, y.nonfinite_b);
    };
    same(SumBlock<2>(a.data(), b.data(), n), SumBlockAvx2(a.data(), b.data(), n));
    same(SumBlock<2>(a64.data(), b64.data(), n), SumBlockAvx2(a64.data(), b64.data(), n));
    same(SumBlock<2>(a.data(), b64.data(), n), SumBlockAvx2(a.data(), b64.data(), n));
    same(SumBlock<2>(a64.data(), b.data(), n), SumBlockAvx2(a64.data(), b.data(), n));
  }
#else
  GTEST_SKIP() << "built without the AVX2 block";
#endif
}

}  // namespace
}  // namespace gradtrace::diff
