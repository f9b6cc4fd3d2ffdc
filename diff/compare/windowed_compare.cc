#include "compare/windowed_compare.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "load/window_gather.h"

namespace gradtrace::diff {
namespace {

using Frames = std::vector<std::vector<const FrameRef*>>;

// Both sides of one parameter, gathered a window at a time.
struct Sides {
  Sides(const TraceSet& x, const TraceSet& y, const Frames& fx, const Frames& fy, int32_t id_x, int32_t id_y,
        Combine combine, bool narrow_a, bool narrow_b, ReaderCache* readers)
      : a(x, fx, id_x, combine, narrow_a, readers),
        b(y, fy, id_y, combine, narrow_b, readers),
        wa(narrow_a),
        wb(narrow_b) {}
  WindowGather a, b;
  WindowValues wa, wb;
};

// Calls visit(wa, wb) for each window of `window` elements that either side
// has full values in, in ascending order: windows with no data are skipped.
template <typename Visit>
Status ForEachWindow(Sides* s, int64_t window, bool record, Visit&& visit) {
  GT_RETURN_IF_ERROR(s->a.Start());
  GT_RETURN_IF_ERROR(s->b.Start());
  const int64_t numel = s->a.numel();
  for (int64_t lo = std::min(s->a.NextData(), s->b.NextData()); lo < numel;
       lo = std::min(s->a.NextData(), s->b.NextData())) {
    const int64_t hi = lo + std::min(window, numel - lo);
    GT_RETURN_IF_ERROR(s->a.Gather(lo, hi, record, &s->wa));
    GT_RETURN_IF_ERROR(s->b.Gather(lo, hi, record, &s->wb));
    visit(s->wa, s->wb);
  }
  return Status::Ok();
}

// The side as the comparison sees it: sketch and stats from `others`, full values and replica agreement from the
// windows. The worst replica is found per rank over all windows, in rank order, as MergeRank finds it.
SideSummary SummaryOf(const WindowGather& g, const SideValues& others) {
  SideSummary s = Summarize(others);
  s.has_full = g.has_full();
  s.covered = g.covered();
  s.replica_diff2 += g.replicas().diff2;
  s.replica_ref2 += g.replicas().ref2;
  double worst = 0;
  int other = -1;
  for (const auto& [rank, sums] : g.replicas().by_rank) {
    const auto [d2, ref2] = sums;
    if (d2 + ref2 <= 0) continue;
    const double rel = ref2 > 0 ? std::sqrt(d2 / ref2) : 1.0;
    if (rel > worst) worst = rel, other = rank;
  }
  if (other >= 0 && worst >= others.replica_worst) s.replica_other = other;
  return s;
}

// What the sketch and stats bases need of the full values: the values at the
// sketch positions, and the moments of a complete side without stats.
struct FullExtras {
  std::map<int64_t, double> at_a, at_b;
  Moments moments_a, moments_b;
};

void AddMoments(const WindowValues& w, Moments* m) {
  w.WithValues([&](const auto& v) {
    for (int64_t i = 0; i < w.size(); ++i) m->Add(v[i]);
  });
}

// Second pass (mixed capture modes, incomplete sides): collects FullExtras.
Status CollectExtras(Sides* s, int64_t window, const std::map<int64_t, double>* keys, bool moments_a, bool moments_b,
                     FullExtras* out) {
  return ForEachWindow(s, window, false, [&](const WindowValues& wa, const WindowValues& wb) {
    const int64_t lo = wa.lo(), hi = lo + wa.size();
    if (keys != nullptr) {
      for (auto it = keys->lower_bound(lo); it != keys->end() && it->first < hi; ++it) {
        const int64_t i = it->first - lo;
        if (wa.set(i)) out->at_a[it->first] = wa.at(i);
        if (wb.set(i)) out->at_b[it->first] = wb.at(i);
      }
    }
    // A complete side is complete in every window, which then tile it in order: MomentsOf's sequence.
    if (moments_a) AddMoments(wa, &out->moments_a);
    if (moments_b) AddMoments(wb, &out->moments_b);
  });
}

// A side's value at `pos`: its full value when it has one there, else its sketch value (side_compare.cc ValueAt).
bool ValueAt(const std::map<int64_t, double>& full, const SideValues& others, int64_t pos, double* out) {
  for (const auto* m : {&full, &others.sparse}) {
    auto it = m->find(pos);
    if (it == m->end()) continue;
    *out = it->second;
    return true;
  }
  return false;
}

// The sketch or stats basis (ComparePartial), reading the full values again where it needs them.
Status ComparePartly(Sides* s, int64_t window, const SideValues& oa, const SideValues& ob, WindowedResult* out) {
  const bool sketched = !oa.sparse.empty() || !ob.sparse.empty();
  const std::map<int64_t, double>& keys = !oa.sparse.empty() ? oa.sparse : ob.sparse;
  const bool lookup = sketched && (out->a.has_full || out->b.has_full);
  const bool stats_a = oa.has_stats || out->a.complete(), stats_b = ob.has_stats || out->b.complete();
  const bool moments_a = stats_a && stats_b && !oa.has_stats, moments_b = stats_a && stats_b && !ob.has_stats;
  FullExtras extras;
  if (lookup || moments_a || moments_b) {
    GT_RETURN_IF_ERROR(CollectExtras(s, window, lookup ? &keys : nullptr, moments_a, moments_b, &extras));
  }
  std::vector<double> va, vb;
  for (auto it = keys.begin(); sketched && it != keys.end(); ++it) {
    double x, y;
    if (ValueAt(extras.at_a, oa, it->first, &x) && ValueAt(extras.at_b, ob, it->first, &y)) {
      va.push_back(x);
      vb.push_back(y);
    }
  }
  auto moments = [&](int side) {
    const SideValues& o = side == 0 ? oa : ob;
    return o.has_stats ? o.moments : (side == 0 ? extras.moments_a : extras.moments_b);
  };
  out->metrics = ComparePartial(out->a, out->b, sketched, va, vb, moments, &out->note);
  return Status::Ok();
}

// One attempt with the given storage: first pass (full sums, coverage, replicas), then the basis.
Status Compare(Sides* s, int64_t window, WindowedResult* out) {
  FullSums sums;
  GT_RETURN_IF_ERROR(ForEachWindow(s, window, true, [&](const WindowValues& wa, const WindowValues& wb) {
    if (!wa.complete() || !wb.complete()) return;  // then a side is incomplete: the full basis is not used
    wa.WithValues(
        [&](const auto& va) { wb.WithValues([&](const auto& vb) { sums.Add(va.data(), vb.data(), wa.size()); }); });
  }));
  const SideValues oa = s->a.MergedOthers(), ob = s->b.MergedOthers();
  out->a = SummaryOf(s->a, oa);
  out->b = SummaryOf(s->b, ob);
  if (out->a.complete() && out->b.complete()) {
    out->metrics = sums.Finish(Basis::kFull);
    return Status::Ok();
  }
  return ComparePartly(s, window, oa, ob, out);
}

}  // namespace

Status CompareWindowed(const TraceSet& x, const TraceSet& y, const Frames& frames_x, const Frames& frames_y,
                       int32_t id_x, int32_t id_y, Combine combine, int64_t window, ReaderCache* readers,
                       WindowedResult* out) {
  // Float storage where values are copied (replicas) and exact in float, as gather.cc keeps them; a side that turns
  // out to hold fp64 values is gathered again in double.
  bool narrow_a = combine == Combine::kReplicas && x.run().params(id_x).dtype() != pb::FP64;
  bool narrow_b = combine == Combine::kReplicas && y.run().params(id_y).dtype() != pb::FP64;
  for (;;) {
    *out = WindowedResult();
    Sides sides(x, y, frames_x, frames_y, id_x, id_y, combine, narrow_a, narrow_b, readers);
    // Double storage takes twice the bytes per element: half the window keeps the memory per thread.
    const int64_t elements = narrow_a && narrow_b ? window : std::max<int64_t>(1, window / 2);
    Status st = Compare(&sides, elements, out);
    if (st.ok()) return st;
    if (sides.a.out_of_order() || sides.b.out_of_order()) {
      *out = WindowedResult();
      out->whole = true;
      return Status::Ok();
    }
    if (!sides.a.needs_wide() && !sides.b.needs_wide()) return st;
    narrow_a = narrow_a && !sides.a.needs_wide();
    narrow_b = narrow_b && !sides.b.needs_wide();
  }
}

}  // namespace gradtrace::diff
