#include "compare/side_compare.h"

#include <cmath>

namespace gradtrace::diff {

Moments MomentsOf(const SideValues& v) {
  Moments m;
  v.WithDense([&m](const auto& dense) {
    for (double x : dense) m.Add(x);
  });
  return m;
}

namespace {

// A side's value at `pos`: its full value when it has one there, else its sketch value.
bool ValueAt(const SideValues& v, int64_t pos, double* out) {
  if (v.has_full() && v.filled[pos]) {
    *out = v.at(pos);
    return true;
  }
  auto it = v.sparse.find(pos);
  if (it == v.sparse.end()) return false;
  *out = it->second;
  return true;
}

bool StatsComparable(const SideSummary& v) { return v.has_stats || v.complete(); }

}  // namespace

double SideSummary::replica_rel() const {
  return replica_ref2 > 0 ? std::sqrt(replica_diff2 / replica_ref2) : (replica_diff2 > 0 ? 1.0 : 0.0);
}

SideSummary Summarize(const SideValues& v) {
  SideSummary s;
  s.numel = v.numel;
  s.ranks = v.ranks;
  s.has_full = v.has_full();
  s.covered = v.covered;
  s.has_sparse = !v.sparse.empty();
  s.has_stats = v.has_stats;
  s.stats_sums_only = v.stats_sums_only;
  s.replica_diff2 = v.replica_diff2;
  s.replica_ref2 = v.replica_ref2;
  s.replica_rank = v.replica_rank;
  s.replica_other = v.replica_other;
  return s;
}

std::string Coverage(const char* side, const SideSummary& v) {
  if (v.ranks == 0) return std::string("no ") + side + " records";
  if (v.has_full) {
    return std::string(side) + " covers " + std::to_string(v.covered) + " of " + std::to_string(v.numel) + " elements";
  }
  return std::string(side) + " has no full values";
}

Metrics CompareSides(const SideValues& a, const SideValues& b, std::string* note) {
  if (a.complete() && b.complete()) {
    return a.WithDense([&](const auto& da) {
      return b.WithDense([&](const auto& db) { return CompareValues(da.data(), db.data(), a.numel, Basis::kFull); });
    });
  }
  const bool sketched = !a.sparse.empty() || !b.sparse.empty();
  std::vector<double> va, vb;
  if (sketched) {
    const SideValues& keys = !a.sparse.empty() ? a : b;
    for (const auto& [pos, unused] : keys.sparse) {
      double x, y;
      if (ValueAt(a, pos, &x) && ValueAt(b, pos, &y)) {
        va.push_back(x);
        vb.push_back(y);
      }
    }
  }
  auto moments = [&](int side) {
    const SideValues& v = side == 0 ? a : b;
    return v.has_stats ? v.moments : MomentsOf(v);
  };
  return ComparePartial(Summarize(a), Summarize(b), sketched, va, vb, moments, note);
}

Metrics ComparePartial(const SideSummary& a, const SideSummary& b, bool sketched, const std::vector<double>& va,
                       const std::vector<double>& vb, const std::function<Moments(int side)>& moments,
                       std::string* note) {
  if (sketched) {
    if (!va.empty()) return CompareValues(va.data(), vb.data(), static_cast<int64_t>(va.size()), Basis::kSketch);
    *note = "no shared sketch positions";
  }
  if (StatsComparable(a) && StatsComparable(b)) {
    const bool sums_only = a.stats_sums_only || b.stats_sums_only;
    *note = sums_only ? "stats mode: only sums are comparable (sums over ranks or micro-steps)"
                      : "stats mode: scale from norms; residual is the disagreement of sum/norm/max scale estimates";
    return CompareMoments(moments(0), moments(1), sums_only);
  }
  if (note->empty()) {
    *note = !a.complete() ? Coverage("A", a) : Coverage("B", b);
  }
  Metrics none;
  none.nonfinite_a = 0;
  return none;
}

}  // namespace gradtrace::diff
