#include "compare/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

namespace gradtrace::diff {

const char* VerdictName(Verdict v) {
  switch (v) {
    case Verdict::kMatch:
      return "match";
    case Verdict::kScaled:
      return "scaled";
    case Verdict::kMismatch:
      return "mismatch";
    case Verdict::kMissing:
      return "missing";
    case Verdict::kNonfinite:
      return "nonfinite";
  }
  return "?";
}

int Severity(Verdict v) {
  switch (v) {
    case Verdict::kMatch:
      return 0;
    case Verdict::kScaled:
      return 1;
    case Verdict::kMissing:
      return 2;
    case Verdict::kMismatch:
      return 3;
    case Verdict::kNonfinite:
      return 4;
  }
  return 5;
}

const char* BasisName(Basis b) {
  switch (b) {
    case Basis::kFull:
      return "full";
    case Basis::kSketch:
      return "sketch";
    case Basis::kStats:
      return "stats";
    case Basis::kNone:
      return "none";
  }
  return "?";
}

void Moments::Add(double v) {
  if (!std::isfinite(v)) {
    ++nonfinite;
    return;
  }
  ++count;
  sum += v;
  sum_sq += v * v;
  abs_max = std::max(abs_max, std::fabs(v));
}

void Moments::Merge(const Moments& o) {
  count += o.count;
  sum += o.sum;
  sum_sq += o.sum_sq;
  abs_max = std::max(abs_max, o.abs_max);
  nonfinite += o.nonfinite;
}

namespace {

// kSumLanes partial sums as four vectors of two doubles: GCC's vector extension,
// so the loops are SIMD at the baseline ISA (SSE2) without relying on the
// auto-vectorizer, which left them scalar at -O2 (24 accumulators spilled).
// Lane l is element 2k + j of vector k: the sums are those of scalar lanes.
using V2 = double __attribute__((vector_size(16)));
using U2 = uint64_t __attribute__((vector_size(16)));
constexpr int kVecs = kSumLanes / 2;

template <typename T>
inline V2 Load2(const T* p) {
  return V2{static_cast<double>(p[0]), static_cast<double>(p[1])};
}
inline V2 Abs(V2 v) {
  const U2 mask = {~(uint64_t{1} << 63), ~(uint64_t{1} << 63)};
  return reinterpret_cast<V2>(reinterpret_cast<U2>(v) & mask);
}
// max(m, v) as std::max(m, v) per lane: v only where m < v, so NaN never wins.
inline V2 Max(V2 m, V2 v) { return m < v ? v : m; }
inline void Spill(const V2* v, double* lanes) {
  for (int k = 0; k < kVecs; ++k) lanes[2 * k] = v[k][0], lanes[2 * k + 1] = v[k][1];
}

}  // namespace

template <typename A, typename B>
void FullSums::AddWindow(const A* a_in, const B* b_in, int64_t n) {
  // kSumLanes interleaved partial sums, element i in lane i % kSumLanes: independent
  // chains in SIMD, in a fixed order, so results do not depend on threads or
  // shards. No per-element branch: non-finite values are counted in a second
  // pass only when they made a sum non-finite.
  double aa_l[kSumLanes] = {}, ab_l[kSumLanes] = {}, bb_l[kSumLanes] = {};
  const int64_t full = n - n % kSumLanes;
  {
    V2 aa[kVecs] = {}, ab[kVecs] = {}, bb[kVecs] = {};
    for (int64_t i = 0; i < full; i += kSumLanes) {
      for (int k = 0; k < kVecs; ++k) {
        const V2 x = Load2(a_in + i + 2 * k), y = Load2(b_in + i + 2 * k);
        aa[k] += x * x;
        ab[k] += x * y;
        bb[k] += y * y;
      }
    }
    Spill(aa, aa_l), Spill(ab, ab_l), Spill(bb, bb_l);
  }
  for (int64_t i = full; i < n; ++i) {
    const double x = a_in[i], y = b_in[i];
    aa_l[i - full] += x * x;
    ab_l[i - full] += x * y;
    bb_l[i - full] += y * y;
  }
  const double aa = LaneSum(aa_l), ab = LaneSum(ab_l), bb = LaneSum(bb_l);
  if (!std::isfinite(aa) || !std::isfinite(bb)) {
    for (int64_t i = 0; i < n; ++i) {
      nonfinite_a_ += !std::isfinite(static_cast<double>(a_in[i]));
      nonfinite_b_ += !std::isfinite(static_cast<double>(b_in[i]));
    }
  }
  // Second pass: residual against this window's own scale, error and its maximum.
  double res_l[kSumLanes] = {}, err_l[kSumLanes] = {}, max_l[kSumLanes] = {}, cross_l[kSumLanes] = {};
  const double s = aa > 0 ? ab / aa : 0;
  {
    const V2 sv = {s, s};
    V2 res[kVecs] = {}, err[kVecs] = {}, mx[kVecs] = {}, cross[kVecs] = {};
    for (int64_t i = 0; i < full; i += kSumLanes) {
      for (int k = 0; k < kVecs; ++k) {
        const V2 x = Load2(a_in + i + 2 * k), y = Load2(b_in + i + 2 * k);
        const V2 r = y - sv * x, e = y - x;
        res[k] += r * r;
        err[k] += e * e;
        cross[k] += x * r;
        mx[k] = Max(mx[k], Abs(e));
      }
    }
    Spill(res, res_l), Spill(err, err_l), Spill(mx, max_l), Spill(cross, cross_l);
  }
  for (int64_t i = full; i < n; ++i) {
    const int l = static_cast<int>(i - full);
    const double x = a_in[i], y = b_in[i];
    const double r = y - s * x, e = y - x;
    res_l[l] += r * r;
    err_l[l] += e * e;
    cross_l[l] += x * r;
    max_l[l] = std::max(max_l[l], std::fabs(e));  // NaN never wins, as before
  }
  aa_ += aa;
  ab_ += ab;
  bb_ += bb;
  err2_ += LaneSum(err_l);
  max_abs_ = std::max(max_abs_, *std::max_element(max_l, max_l + kSumLanes));
  n_ += n;
  windows_.push_back({s, aa, LaneSum(res_l), LaneSum(cross_l)});
}

template <typename A, typename B>
void FullSums::Add(const A* a, const B* b, int64_t n, bool ends) {
  while (n > 0) {
    if (pending_ == 0 && (n >= kBlock || ends)) {
      const int64_t m = std::min(n, kBlock);
      AddWindow(a, b, m);
      a += m, b += m, n -= m;
      continue;
    }
    if (pending_a_.empty()) pending_a_.resize(kBlock), pending_b_.resize(kBlock);
    const int64_t m = std::min(n, kBlock - pending_);
    std::copy(a, a + m, pending_a_.begin() + pending_);
    std::copy(b, b + m, pending_b_.begin() + pending_);
    pending_ += m, a += m, b += m, n -= m;
    if (pending_ == kBlock || (ends && n == 0)) {
      AddWindow(pending_a_.data(), pending_b_.data(), pending_);
      pending_ = 0;
    }
  }
}

Metrics FullSums::Finish(Basis basis) {
  if (pending_ > 0) {
    AddWindow(pending_a_.data(), pending_b_.data(), pending_);
    pending_ = 0;
  }
  Metrics m;
  m.basis = basis;
  m.compared = n_;
  m.nonfinite_a = nonfinite_a_;
  m.nonfinite_b = nonfinite_b_;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  m.norm_a = std::sqrt(aa_);
  m.norm_b = std::sqrt(bb_);
  m.scale = aa_ > 0 ? ab_ / aa_ : nan;
  m.cosine = (aa_ > 0 && bb_ > 0) ? ab_ / (m.norm_a * m.norm_b) : nan;
  const double s = aa_ > 0 ? m.scale : 0;
  double res2 = 0;
  for (const Window& w : windows_) {
    const double d = s - w.scale;  // 0 for a single window: its residual as summed
    res2 += d == 0 ? w.res2 : w.res2 - 2 * d * w.cross + d * d * w.aa;
  }
  m.max_abs_error = max_abs_;
  if (bb_ > 0) {
    m.residual = std::sqrt(res2) / m.norm_b;
    m.rel_error = std::sqrt(err2_) / m.norm_b;
  } else {
    // b is zero: any non-zero a is entirely error, relative to a.
    m.residual = aa_ > 0 ? 1.0 : 0.0;
    m.rel_error = aa_ > 0 ? 1.0 : 0.0;
  }
  return m;
}

template <typename A, typename B>
Metrics CompareValues(const A* a, const B* b, int64_t n, Basis basis) {
  FullSums sums;
  sums.Add(a, b, n, true);
  return sums.Finish(basis);
}

template Metrics CompareValues(const double*, const double*, int64_t, Basis);
template Metrics CompareValues(const float*, const float*, int64_t, Basis);
template Metrics CompareValues(const float*, const double*, int64_t, Basis);
template Metrics CompareValues(const double*, const float*, int64_t, Basis);
template void FullSums::Add(const double*, const double*, int64_t, bool);
template void FullSums::Add(const float*, const float*, int64_t, bool);
template void FullSums::Add(const float*, const double*, int64_t, bool);
template void FullSums::Add(const double*, const float*, int64_t, bool);

Metrics CompareMoments(const Moments& a, const Moments& b, bool sums_only) {
  Metrics m;
  m.basis = Basis::kStats;
  m.sums_only = sums_only;
  m.nonfinite_a = a.nonfinite;
  m.nonfinite_b = b.nonfinite;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  m.cosine = nan;
  auto rel = [](double x, double y) {
    double d = std::max(std::fabs(x), std::fabs(y));
    return d > 0 ? std::fabs(x - y) / d : 0.0;
  };
  if (sums_only) {
    m.scale = a.sum != 0 ? b.sum / a.sum : nan;
    m.residual = nan;
    m.rel_error = rel(a.sum, b.sum);
    m.max_abs_error = std::fabs(b.sum - a.sum);
    return m;
  }
  m.norm_a = std::sqrt(a.sum_sq);
  m.norm_b = std::sqrt(b.sum_sq);
  if (a.sum_sq <= 0) {
    m.scale = nan;
    m.residual = b.sum_sq > 0 ? 1.0 : 0.0;
    m.rel_error = m.residual;
    return m;
  }
  double s_norm = std::sqrt(b.sum_sq / a.sum_sq);
  double sign = (a.sum * b.sum < 0) ? -1.0 : 1.0;
  m.scale = sign * s_norm;
  // If B = s·A exactly, every moment scales consistently; their disagreement
  // bounds how far B is from a multiple of A (it cannot prove equality).
  double s_sum = a.sum != 0 ? b.sum / a.sum : m.scale;
  double s_max = a.abs_max > 0 ? sign * b.abs_max / a.abs_max : m.scale;
  m.residual = std::max(rel(s_sum, m.scale), rel(s_max, m.scale));
  // Relative error of the norms and sums, the closest stats analogue of ||b-a||/||b||.
  m.rel_error =
      std::max({rel(m.norm_a, m.norm_b), rel(a.sum, b.sum) * (std::fabs(a.sum) > 0 ? 1 : 0), std::fabs(sign - 1) / 2});
  m.max_abs_error = std::fabs(b.abs_max - a.abs_max);
  return m;
}

Verdict Classify(const Metrics& m, double rtol, double atol) {
  if (m.nonfinite_a > 0 || m.nonfinite_b > 0) return Verdict::kNonfinite;
  if (m.basis == Basis::kNone) return Verdict::kMissing;
  if (m.norm_a == 0 && m.norm_b == 0 && !m.sums_only) return Verdict::kMatch;
  if (m.rel_error <= rtol) return Verdict::kMatch;
  if (atol > 0 && (m.basis == Basis::kFull || m.basis == Basis::kSketch)) {
    // Absolute norms back from the relative ones (relative to ||b||, or all of
    // ||a|| when b is zero).
    const double allowed = rtol * m.norm_b + atol * std::sqrt(static_cast<double>(std::max<int64_t>(m.compared, 1)));
    const double error = m.norm_b > 0 ? m.rel_error * m.norm_b : m.norm_a;
    if (error <= allowed) return Verdict::kMatch;
    const double residual = m.norm_b > 0 ? m.residual * m.norm_b : m.norm_a;
    if (std::isfinite(m.scale) && residual <= allowed) return Verdict::kScaled;
  }
  if (std::isfinite(m.scale) && std::isnan(m.residual) == false && m.residual <= rtol) return Verdict::kScaled;
  if (m.sums_only && std::isfinite(m.scale)) return Verdict::kScaled;
  return Verdict::kMismatch;
}

}  // namespace gradtrace::diff
