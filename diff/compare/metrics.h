// Per-parameter comparison of B against A: how well B ≈ s·A holds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

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
  double max_abs_error = 0;  // max |b_i - a_i|; stats: ||abs_max_b - abs_max_a||; NaN with non-finite elements
  double norm_a = 0, norm_b = 0;
  int64_t nonfinite_a = 0, nonfinite_b = 0;
  bool sums_only = false;  // stats of sums across ranks/micro-steps: only the sums are comparable
};

// Sums over many elements run in kSumLanes interleaved chains, element i in
// lane i % kSumLanes, joined by LaneSum in a fixed order: the result does not
// depend on threads, shards or windows (FullSums, the replica merge in gather.cc).
inline constexpr int kSumLanes = 8;
inline double LaneSum(const double* l) { return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7])); }

// a and b are n aligned values. Two-pass (s first, then the residual directly),
// so a residual far below sqrt(double epsilon) is still measured, not cancelled.
// A and B are double or float (full values of at most 32-bit dtypes are kept
// as float); sums are always double.
template <typename A, typename B>
Metrics CompareValues(const A* a, const B* b, int64_t n, Basis basis);

// CompareValues over a parameter given its elements in order, in pieces of
// any size (issue 24: memory bounded by a window or a frame, not the
// parameter). Elements are summed in blocks of kBlock counted from the
// parameter's first element, whatever the pieces: every path (whole, windowed,
// streamed from frames) and CompareValues itself sum the same blocks, so their
// results are equal bit for bit. Each block is summed as one pass of a.a, a.b,
// b.b and, against the block's own scale s_w, R_w = ||b - s_w a||^2 and
// C_w = <a, b - s_w a>, from cache (a block of two sides fits in L2). At the
// end, for the scale s of the whole,
//   ||b - s a||^2 = sum_w R_w - 2 (s - s_w) C_w + (s - s_w)^2 a_w.a_w,
// exact for any s_w; as s_w minimises R_w, C_w is rounding and the other two
// terms are positive, so nothing cancels and the residual stays as exact as a
// two-pass one over the whole parameter, without a second pass over the data
// (which would read it again from memory). A parameter of one block is summed
// exactly as the two-pass method; more blocks differ from that by rounding
// only (sums by summation order, the residual by about 4u / residual relative,
// u = 2^-53: 1e-10 at a residual of 4e-8; an exact multiple gives 0 in both).
class FullSums {
 public:
  static constexpr int64_t kBlock = int64_t{1} << 14;
  // The next n elements of both sides. `ends`: they are the parameter's last
  // (a partial block is then summed as it is, not copied to wait for more).
  template <typename A, typename B>
  void Add(const A* a, const B* b, int64_t n, bool ends = false);
  Metrics Finish(Basis basis);

 private:
  template <typename A, typename B>
  void AddWindow(const A* a, const B* b, int64_t n);

  struct Window {
    double scale, aa, res2, cross;
  };
  double aa_ = 0, ab_ = 0, bb_ = 0, err2_ = 0, max_abs_ = 0;
  int64_t n_ = 0, nonfinite_a_ = 0, nonfinite_b_ = 0;
  std::vector<Window> windows_;
  // A block given in several pieces, widened to double (exact) until it is whole.
  std::vector<double> pending_a_, pending_b_;
  int64_t pending_ = 0;
};
Metrics CompareMoments(const Moments& a, const Moments& b, bool sums_only);

// match: ||b - a|| <= rtol*||b|| + atol*sqrt(n); scaled: the same for
// b - s*a (B is s·A, s != 1); mismatch otherwise; nonfinite when either side
// has a NaN or Inf. atol is the absolute floor of tolerance.h (full and sketch
// bases; n the elements compared). Two zero gradients match; one zero and one
// not is a mismatch unless the other is within the floor.
Verdict Classify(const Metrics& m, double rtol, double atol = 0);

}  // namespace gradtrace::diff
