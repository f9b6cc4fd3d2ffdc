#include "candidates.h"

#include <algorithm>
#include <cmath>

#include "degrees.h"

namespace gradtrace::semantics {

bool NearFactor(double x, double want, double ctol) {
  return std::isfinite(x) && std::fabs(x - want) <= ctol * std::fabs(want);
}

std::vector<Candidate> ScaleCandidates(const pb::Config& a, const pb::Config& b) {
  std::vector<Candidate> out;
  out.push_back({"1", 1.0, Dimension::kOne, false, 'B', 0});
  for (const auto& atom : ConfigDegrees()) {
    double va = atom.get(a), vb = atom.get(b);
    const Dimension k = atom.dim;
    const std::string n = DimensionName(k);
    if (vb > 1) {
      out.push_back({n + "(B)", vb, k, false, 'B', 1});
      out.push_back({"1/" + n + "(B)", 1 / vb, k, true, 'B', 2});
    }
    if (va > 1) {
      out.push_back({n + "(A)", va, k, false, 'A', 1});
      out.push_back({"1/" + n + "(A)", 1 / va, k, true, 'A', 2});
    }
    // A division by gas applied twice too often (DeepSpeed #7749); only that direction: a factor of
    // gas^2 upward is as likely gas x dp, which the candidates do not name.
    if (k == Dimension::kGas && vb > 1) out.push_back({"1/" + n + "(B)^2", 1 / (vb * vb), k, true, 'B', 3, true});
    if (va > 1 && vb > 1 && va != vb) {
      out.push_back({n + "(B)/" + n + "(A)", vb / va, k, false, 'R', 3});
      out.push_back({n + "(A)/" + n + "(B)", va / vb, k, true, 'R', 3});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& x, const Candidate& y) {
    if (x.complexity != y.complexity) return x.complexity < y.complexity;
    if (x.side != y.side) return x.side == 'B';
    return DegreeRank(x.kind) < DegreeRank(y.kind);
  });
  return out;
}

std::vector<Candidate> MatchFactor(double value, const std::vector<Candidate>& candidates, double ctol) {
  std::vector<Candidate> out;
  if (!std::isfinite(value)) return out;
  for (const auto& c : candidates) {
    if (std::fabs(value - c.value) <= ctol * std::fabs(c.value)) out.push_back(c);
  }
  return out;
}

}  // namespace gradtrace::semantics
