#include "compare/metrics.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>

#include "compare/block_sums_kernel.h"
#include "cpu_features.h"

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

template <typename A, typename B>
void FullSums::AddWindow(const A* a, const B* b, int64_t n) {
  // The same bits either way (block_sums_kernel.h): AVX2 where the CPU has it.
#if GRADTRACE_BLOCK_SUMS_AVX2
  const BlockSums w = CpuHasAvx2() ? SumBlockAvx2(a, b, n) : SumBlock<2>(a, b, n);
#else
  const BlockSums w = SumBlock<2>(a, b, n);
#endif
  nonfinite_a_ += w.nonfinite_a;
  nonfinite_b_ += w.nonfinite_b;
  aa_ += w.aa;
  ab_ += w.ab;
  bb_ += w.bb;
  err2_ += w.err2;
  max_abs_ = std::max(max_abs_, w.max_abs);
  n_ += n;
  windows_.push_back({w.scale, w.aa, w.res2, w.cross});
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
  // The kernel skips non-finite elements; the largest error is then not a number, not the finite ones' (issue 42).
  m.max_abs_error = nonfinite_a_ + nonfinite_b_ > 0 ? nan : max_abs_;
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
    m.max_abs_error = a.nonfinite + b.nonfinite > 0 ? nan : std::fabs(b.sum - a.sum);
    return m;
  }
  m.norm_a = std::sqrt(a.sum_sq);
  m.norm_b = std::sqrt(b.sum_sq);
  m.max_abs_error = a.nonfinite + b.nonfinite > 0 ? nan : std::fabs(b.abs_max - a.abs_max);
  if (a.sum_sq <= 0) {
    m.scale = nan;
    m.residual = b.sum_sq > 0 ? 1.0 : 0.0;
    m.rel_error = m.residual;
    return m;
  }
  // A sum that cancels (below kSumSignificance of sqrt(count) x the norm: a softmax head's or a normalised
  // layer's gradient, whose elements sum to zero up to rounding) is rounding noise: its ratio and sign say
  // nothing of the scale. The sums count when either side's does (one cancelling, the other not, differs).
  constexpr double kSumSignificance = 1e-3;
  auto significant = [&](const Moments& x) {
    return std::fabs(x.sum) >
           kSumSignificance * std::sqrt(static_cast<double>(std::max<int64_t>(x.count, 1)) * x.sum_sq);
  };
  const bool sums_tell = a.sum != 0 && (significant(a) || significant(b));
  double s_norm = std::sqrt(b.sum_sq / a.sum_sq);
  double sign = (sums_tell && a.sum * b.sum < 0) ? -1.0 : 1.0;
  m.scale = sign * s_norm;
  // If B = s·A exactly, every moment scales consistently; their disagreement
  // bounds how far B is from a multiple of A (it cannot prove equality).
  double s_sum = sums_tell ? b.sum / a.sum : m.scale;
  double s_max = a.abs_max > 0 ? sign * b.abs_max / a.abs_max : m.scale;
  m.residual = std::max(rel(s_sum, m.scale), rel(s_max, m.scale));
  // Relative error of the norms and sums, the closest stats analogue of ||b-a||/||b||.
  m.rel_error = std::max({rel(m.norm_a, m.norm_b), rel(a.sum, b.sum) * (sums_tell ? 1 : 0), std::fabs(sign - 1) / 2});
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
