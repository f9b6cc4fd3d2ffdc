#include "metrics.h"

#include <algorithm>
#include <cmath>
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

template <typename A, typename B>
Metrics CompareValues(const A* a_in, const B* b_in, int64_t n, Basis basis) {
  auto a = [a_in](int64_t i) { return static_cast<double>(a_in[i]); };
  auto b = [b_in](int64_t i) { return static_cast<double>(b_in[i]); };
  Metrics m;
  m.basis = basis;
  m.compared = n;
  // Four interleaved partial sums: independent dependency chains the CPU
  // overlaps (and the compiler may vectorize), in a fixed order, so results
  // do not depend on threads or shards.
  double aa4[4] = {}, ab4[4] = {}, bb4[4] = {};
  int64_t bad_a = 0, bad_b = 0;
  for (int64_t i = 0; i < n; ++i) {
    const int lane = static_cast<int>(i & 3);
    bad_a += !std::isfinite(a(i));
    bad_b += !std::isfinite(b(i));
    aa4[lane] += a(i) * a(i);
    ab4[lane] += a(i) * b(i);
    bb4[lane] += b(i) * b(i);
  }
  m.nonfinite_a = bad_a;
  m.nonfinite_b = bad_b;
  const double aa = (aa4[0] + aa4[1]) + (aa4[2] + aa4[3]);
  const double ab = (ab4[0] + ab4[1]) + (ab4[2] + ab4[3]);
  const double bb = (bb4[0] + bb4[1]) + (bb4[2] + bb4[3]);
  const double nan = std::numeric_limits<double>::quiet_NaN();
  m.norm_a = std::sqrt(aa);
  m.norm_b = std::sqrt(bb);
  m.scale = aa > 0 ? ab / aa : nan;
  m.cosine = (aa > 0 && bb > 0) ? ab / (m.norm_a * m.norm_b) : nan;
  double res4[4] = {}, err4[4] = {}, max_abs = 0;
  const double s = aa > 0 ? m.scale : 0;
  for (int64_t i = 0; i < n; ++i) {
    const int lane = static_cast<int>(i & 3);
    double r = b(i) - s * a(i);
    double e = b(i) - a(i);
    res4[lane] += r * r;
    err4[lane] += e * e;
    max_abs = std::max(max_abs, std::fabs(e));
  }
  m.max_abs_error = max_abs;
  const double res2 = (res4[0] + res4[1]) + (res4[2] + res4[3]);
  const double err2 = (err4[0] + err4[1]) + (err4[2] + err4[3]);
  if (bb > 0) {
    m.residual = std::sqrt(res2) / m.norm_b;
    m.rel_error = std::sqrt(err2) / m.norm_b;
  } else {
    // b is zero: any non-zero a is entirely error, relative to a.
    m.residual = aa > 0 ? 1.0 : 0.0;
    m.rel_error = aa > 0 ? 1.0 : 0.0;
  }
  return m;
}

template Metrics CompareValues(const double*, const double*, int64_t, Basis);
template Metrics CompareValues(const float*, const float*, int64_t, Basis);
template Metrics CompareValues(const float*, const double*, int64_t, Basis);
template Metrics CompareValues(const double*, const float*, int64_t, Basis);

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

Verdict Classify(const Metrics& m, double rtol) {
  if (m.nonfinite_a > 0 || m.nonfinite_b > 0) return Verdict::kNonfinite;
  if (m.basis == Basis::kNone) return Verdict::kMissing;
  if (m.norm_a == 0 && m.norm_b == 0 && !m.sums_only) return Verdict::kMatch;
  if (m.rel_error <= rtol) return Verdict::kMatch;
  if (std::isfinite(m.scale) && std::isnan(m.residual) == false && m.residual <= rtol) return Verdict::kScaled;
  if (m.sums_only && std::isfinite(m.scale)) return Verdict::kScaled;
  return Verdict::kMismatch;
}

}  // namespace gradtrace::diff
