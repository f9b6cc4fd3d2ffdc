// Per-parameter comparison of B against A: how well B ≈ s·A holds.
#pragma once

#include <cstdint>
#include <string>

namespace gradtrace::diff {

enum class Verdict { kMatch, kScaled, kMismatch, kMissing, kNonfinite };
const char* VerdictName(Verdict v);  // "match", "scaled", ...
// Larger is worse: nonfinite > mismatch > missing > scaled > match (table order).
int Severity(Verdict v);

// Moments of one side's values, as the stats capture mode stores them.
struct Moments {
  int64_t count = 0;
  double sum = 0;
  double sum_sq = 0;
  double abs_max = 0;
  int64_t nonfinite = 0;
  void Add(double v);
  void Merge(const Moments& o);
};

// What was compared: all elements, the shared sketch positions, or moments only.
enum class Basis { kFull, kSketch, kStats, kNone };
const char* BasisName(Basis b);

struct Metrics {
  Basis basis = Basis::kNone;
  int64_t compared = 0;      // elements compared (0 for stats)
  double scale = 0;          // s = <a,b>/<a,a>; in stats mode sign(sum_a*sum_b)*sqrt(sum_sq_b/sum_sq_a)
  double residual = 0;       // ||b - s*a|| / ||b||; stats: disagreement of the sum/norm/max scale estimates
  double cosine = 0;         // <a,b>/(||a|| ||b||); NaN in stats mode
  double rel_error = 0;      // ||b - a|| / ||b||
  double max_abs_error = 0;  // max |b_i - a_i|; stats: ||abs_max_b - abs_max_a||
  double norm_a = 0, norm_b = 0;
  int64_t nonfinite_a = 0, nonfinite_b = 0;
  bool sums_only = false;  // stats of sums across ranks/micro-steps: only the sums are comparable
};

// a and b are n aligned values. Two-pass (s first, then the residual directly),
// so a residual far below sqrt(double epsilon) is still measured, not cancelled.
// A and B are double or float (full values of at most 32-bit dtypes are kept
// as float); sums are always double.
template <typename A, typename B>
Metrics CompareValues(const A* a, const B* b, int64_t n, Basis basis);
Metrics CompareMoments(const Moments& a, const Moments& b, bool sums_only);

// match: ||b - a|| <= rtol*||b|| + atol*sqrt(n); scaled: the same for
// b - s*a (B is s·A, s != 1); mismatch otherwise; nonfinite when either side
// has a NaN or Inf. atol is the absolute floor of tolerance.h (full and sketch
// bases; n the elements compared). Two zero gradients match; one zero and one
// not is a mismatch unless the other is within the floor.
Verdict Classify(const Metrics& m, double rtol, double atol = 0);

}  // namespace gradtrace::diff
