// B against A for one parameter once each side is gathered: on complete full
// values, else on shared sketch positions, else on moments, else a note of
// what is missing. The whole-parameter path (SideValues, gather.h) and the
// windowed one (windowed_compare.h) both end here, so the choice of basis and
// the notes have one home.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "compare/metrics.h"
#include "load/gather.h"

namespace gradtrace::diff {

// What the comparison needs to know of one side besides its values.
struct SideSummary {
  int64_t numel = 0;
  int ranks = 0;  // ranks that contributed
  bool has_full = false;
  int64_t covered = 0;  // elements with full values
  bool has_sparse = false;
  bool has_stats = false;
  bool stats_sums_only = false;
  // Replica agreement (gather.h SideValues): squared difference and reference, first and worst rank.
  double replica_diff2 = 0, replica_ref2 = 0;
  int replica_rank = -1, replica_other = -1;

  bool complete() const { return has_full && covered == numel; }
  // Relative disagreement between replicas (0 when they agree or there are none).
  double replica_rel() const;
  // Full values cover part of the parameter and nothing else was captured: missing data, not a comparison.
  bool only_partly_full() const { return has_full && !complete() && !has_sparse && !has_stats; }
};

SideSummary Summarize(const SideValues& v);

// The moments of a side's full values (as the stats capture mode would have stored them).
Moments MomentsOf(const SideValues& v);

// "A covers X of N elements", "no A records" or "A has no full values".
std::string Coverage(const char* side, const SideSummary& v);

// Whole path: B against A on the richest basis both sides share.
Metrics CompareSides(const SideValues& a, const SideValues& b, std::string* note);

// The comparison when full values are not complete on both sides. `sketched`:
// either side has sketch values; va, vb: both sides' values at the sketch
// positions both hold (dense where a side has it), in ascending position order.
// `moments(0 or 1)`: A's or B's moments (its stats, or those of its complete
// full values), called only when both sides have one or the other.
Metrics ComparePartial(const SideSummary& a, const SideSummary& b, bool sketched, const std::vector<double>& va,
                       const std::vector<double>& vb, const std::function<Moments(int side)>& moments,
                       std::string* note);

}  // namespace gradtrace::diff
