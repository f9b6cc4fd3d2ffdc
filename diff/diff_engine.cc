#include "diff_engine.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <unordered_map>

#include "align.h"
#include "explain.h"
#include "gather.h"
#include "progress.h"
#include "rename.h"
#include "slice_codec.h"
#include "thread_pool.h"
#include "tolerance.h"
#include "work_units.h"

namespace gradtrace::diff {
namespace {

Combine CombineFor(pb::Phase phase) { return phase == pb::PRE_REDUCE ? Combine::kSum : Combine::kReplicas; }

Moments MomentsOf(const SideValues& v) {
  Moments m;
  for (double x : v.dense) m.Add(x);
  return m;
}

std::string Coverage(const char* side, const SideValues& v) {
  if (v.ranks == 0) return std::string("no ") + side + " records";
  if (v.has_full()) {
    return std::string(side) + " covers " + std::to_string(v.covered) + " of " + std::to_string(v.numel) + " elements";
  }
  return std::string(side) + " has no full values";
}

// B against A for one parameter, on the richest basis both sides share.
Metrics CompareSides(const SideValues& a, const SideValues& b, std::string* note) {
  if (a.complete() && b.complete()) return CompareValues(a.dense.data(), b.dense.data(), a.numel, Basis::kFull);
  // Sketch: shared positions, taking dense values where a side has them.
  auto value_at = [](const SideValues& v, int64_t pos, double* out) {
    if (v.has_full() && v.filled[pos]) {
      *out = v.dense[pos];
      return true;
    }
    auto it = v.sparse.find(pos);
    if (it == v.sparse.end()) return false;
    *out = it->second;
    return true;
  };
  if (!a.sparse.empty() || !b.sparse.empty()) {
    const SideValues& keys = !a.sparse.empty() ? a : b;
    std::vector<double> va, vb;
    for (const auto& [pos, unused] : keys.sparse) {
      double x, y;
      if (value_at(a, pos, &x) && value_at(b, pos, &y)) {
        va.push_back(x);
        vb.push_back(y);
      }
    }
    if (!va.empty()) return CompareValues(va.data(), vb.data(), static_cast<int64_t>(va.size()), Basis::kSketch);
    *note = "no shared sketch positions";
  }
  bool sa = a.has_stats || a.complete(), sb = b.has_stats || b.complete();
  if (sa && sb) {
    Moments ma = a.has_stats ? a.moments : MomentsOf(a);
    Moments mb = b.has_stats ? b.moments : MomentsOf(b);
    bool sums_only = a.stats_sums_only || b.stats_sums_only;
    *note = sums_only ? "stats mode: only sums are comparable (sums over ranks or micro-steps)"
                      : "stats mode: scale from norms; residual is the disagreement of sum/norm/max scale estimates";
    return CompareMoments(ma, mb, sums_only);
  }
  if (note->empty()) {
    *note = !a.complete() ? Coverage("A", a) : Coverage("B", b);
  }
  Metrics none;
  none.nonfinite_a = 0;
  return none;
}

struct Compared {
  Metrics metrics;
  std::string note;
  bool computed = false;
  double replica_a = 0, replica_b = 0;  // relative disagreement between replicas
  int replica_rank_a = -1, replica_rank_b = -1, replica_first_a = -1, replica_first_b = -1;
};

// Gathers and compares every aligned parameter of `al` (y against x).
Status CompareAll(const TraceSet& x, const TraceSet& y, const Alignment& al, const DiffOptions& options,
                  Progress* progress, std::vector<Compared>* out) {
  Selection sel{al.step, al.phase};
  auto frames_x = SelectFrames(x, sel);
  auto frames_y = SelectFrames(y, sel);
  std::vector<Unit> units = MakeUnits(al, frames_x, frames_y, options.unit_elements);
  int threads = ResolveThreads(options.threads);
  std::vector<ReaderCache> caches(threads);
  out->assign(al.params.size(), Compared());
  std::mutex mu;
  Status first_error;
  std::atomic<size_t> done{0};
  Combine combine = CombineFor(al.phase);
  ParallelFor(units.size(), threads, [&](size_t u, int worker) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!first_error.ok()) return;
    }
    std::vector<int32_t> ids_x, ids_y;
    for (size_t i : units[u].pairs) {
      ids_x.push_back(al.params[i].id_a);
      ids_y.push_back(al.params[i].id_b);
    }
    std::vector<SideValues> vx, vy;
    Status st = GatherParams(x, frames_x, ids_x, combine, &caches[worker], &vx);
    if (st.ok()) st = GatherParams(y, frames_y, ids_y, combine, &caches[worker], &vy);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = st;
      return;
    }
    for (size_t k = 0; k < units[u].pairs.size(); ++k) {
      Compared& c = (*out)[units[u].pairs[k]];
      c.metrics = CompareSides(vx[k], vy[k], &c.note);
      c.computed = true;
      auto rel = [](const SideValues& v) {
        return v.replica_ref2 > 0 ? std::sqrt(v.replica_diff2 / v.replica_ref2) : (v.replica_diff2 > 0 ? 1.0 : 0.0);
      };
      c.replica_a = rel(vx[k]);
      c.replica_b = rel(vy[k]);
      c.replica_rank_a = vx[k].replica_other;
      c.replica_rank_b = vy[k].replica_other;
      c.replica_first_a = vx[k].replica_rank;
      c.replica_first_b = vy[k].replica_rank;
      // Partial coverage (truncation) is missing data, not a comparison.
      if ((vx[k].has_full() && !vx[k].complete() && vx[k].sparse.empty() && !vx[k].has_stats) ||
          (vy[k].has_full() && !vy[k].complete() && vy[k].sparse.empty() && !vy[k].has_stats)) {
        c.metrics.basis = Basis::kNone;
        c.note = !vx[k].complete() ? Coverage("A", vx[k]) : Coverage("B", vy[k]);
      }
    }
    if (progress) progress->Update(done.fetch_add(1) + 1, units.size());
  });
  if (progress) progress->Finish();
  return first_error;
}

TraceSide SideOf(const TraceSet& s) {
  TraceSide t;
  t.dir = s.dir();
  t.producer = s.run().producer() + (s.run().producer_version().empty() ? "" : " " + s.run().producer_version());
  t.run_id = s.run().run_id();
  t.world = s.world();
  t.truncated = s.truncated();
  t.config = s.config();
  return t;
}

double LogDistance(double s) { return std::isfinite(s) && s != 0 ? std::fabs(std::log(std::fabs(s))) : 1e300; }

}  // namespace

Expected<Report> DiffSets(const TraceSet& a, const TraceSet& b, const DiffOptions& options, const TraceSet* noise) {
  std::vector<RenameRule> rules;
  for (const auto& text : options.renames) {
    auto r = ParseRenameRule(text);
    if (!r.ok()) return r.status();
    rules.push_back(std::move(*r));
  }
  auto aligned = AlignSets(a, b, rules, options.phase, options.step);
  if (!aligned.ok()) return aligned.status();
  Alignment& al = *aligned;

  Report report;
  report.mode = "diff";
  report.a = SideOf(a);
  report.b = SideOf(b);
  report.step = al.step;
  report.phase = PhaseName(al.phase);
  for (const auto& n : al.notes) report.findings.push_back({"note", n});

  uint64_t bytes = a.total_bytes() + b.total_bytes();
  Progress progress("gradtrace-diff: comparing", options.progress && Progress::Wanted(bytes));
  std::vector<Compared> compared;
  GT_RETURN_IF_ERROR(CompareAll(a, b, al, options, &progress, &compared));

  // Tolerance: --rtol, else measured noise, else the dtype/summand bound.
  std::vector<double> rtol(al.params.size());
  if (options.rtol) {
    report.tolerance = FixedTolerance(*options.rtol);
  } else {
    report.tolerance = DefaultTolerance(a.config(), b.config());
  }
  std::fill(rtol.begin(), rtol.end(), report.tolerance.rtol);
  if (noise != nullptr && !options.rtol) {
    auto noise_al = AlignSets(a, *noise, rules, options.phase, al.step);
    if (!noise_al.ok()) return noise_al.status();
    std::vector<Compared> nc;
    GT_RETURN_IF_ERROR(CompareAll(a, *noise, *noise_al, options, nullptr, &nc));
    std::unordered_map<std::string, double> by_name;
    double worst = 0;
    for (size_t i = 0; i < nc.size(); ++i) {
      if (nc[i].computed && std::isfinite(nc[i].metrics.rel_error)) {
        by_name[noise_al->params[i].name] = nc[i].metrics.rel_error;
        worst = std::max(worst, nc[i].metrics.rel_error);
      }
    }
    double u = std::max(UnitRoundoff(a.config().dtype()), UnitRoundoff(b.config().dtype()));
    for (size_t i = 0; i < al.params.size(); ++i) {
      auto it = by_name.find(al.params[i].name);
      rtol[i] = std::max(4 * (it == by_name.end() ? worst : it->second), 4 * u);
    }
    report.tolerance.source = "noise";
    report.tolerance.rtol = *std::max_element(rtol.begin(), rtol.end());
    char buf[200];
    std::snprintf(buf, sizeof(buf), "rtol_p = max(4*rel_error(A, A2)_p, 4u) from %s; largest %.3g",
                  noise->dir().c_str(), report.tolerance.rtol);
    report.tolerance.bound = buf;
  }

  bool replica_problem = false;
  for (size_t i = 0; i < al.params.size(); ++i) {
    const ParamPair& pp = al.params[i];
    ParamResult r;
    r.name = pp.name;
    r.numel = pp.numel;
    r.shape = pp.shape;
    r.dtype = DTypeName(pp.dtype_b != pb::DTYPE_UNSPECIFIED ? pp.dtype_b : pp.dtype_a);
    r.rtol = rtol[i];
    if (!pp.problem.empty()) {
      r.verdict = Verdict::kMissing;
      r.note = pp.problem;
    } else {
      const Compared& c = compared[i];
      r.metrics = c.metrics;
      r.note = c.note;
      r.verdict = Classify(c.metrics, rtol[i]);
      for (int side = 0; side < 2; ++side) {
        double rel = side == 0 ? c.replica_a : c.replica_b;
        if (rel <= rtol[i]) continue;
        replica_problem = true;
        const TraceSet& s = side == 0 ? a : b;
        int first = side == 0 ? c.replica_first_a : c.replica_first_b;
        int other = side == 0 ? c.replica_rank_a : c.replica_rank_b;
        char buf[64];
        std::snprintf(buf, sizeof(buf), "%.3g", rel);
        std::string msg = std::string(side == 0 ? "A" : "B") + ": replicas of '" + pp.name + "' disagree (rank " +
                          std::to_string(first) + " vs rank " + std::to_string(other) + ", relative difference " + buf +
                          ", " + s.ranks()[std::max(other, 0)].path + ")";
        report.findings.push_back({"replica", msg});
        r.note += (r.note.empty() ? "" : "; ") + std::string("replicas disagree in ") + (side == 0 ? "A" : "B");
      }
    }
    report.params.push_back(std::move(r));
  }
  for (const TraceSet* s : {&a, &b}) {
    for (const RankFile& f : s->ranks()) {
      if (f.truncated) {
        report.findings.push_back(
            {"truncated", f.truncation + "; frames after offset " + std::to_string(f.stop_offset) + " are missing"});
      }
    }
  }

  report.groups = GroupParams(report.params, a.config(), b.config(), report.tolerance.rtol);
  std::stable_sort(report.params.begin(), report.params.end(), [](const ParamResult& x, const ParamResult& y) {
    if (Severity(x.verdict) != Severity(y.verdict)) return Severity(x.verdict) > Severity(y.verdict);
    double rx = std::isnan(x.metrics.residual) ? -1 : x.metrics.residual;
    double ry = std::isnan(y.metrics.residual) ? -1 : y.metrics.residual;
    if (rx != ry) return rx > ry;
    return LogDistance(x.metrics.scale) > LogDistance(y.metrics.scale);
  });

  auto any = [&](Verdict v) {
    return std::any_of(report.params.begin(), report.params.end(),
                       [v](const ParamResult& p) { return p.verdict == v; });
  };
  if (any(Verdict::kNonfinite)) {
    report.verdict = "nonfinite";
  } else if (any(Verdict::kMismatch) || replica_problem) {
    report.verdict = "mismatch";
  } else if (any(Verdict::kMissing)) {
    report.verdict = "missing";
  } else if (a.truncated() || b.truncated()) {
    report.verdict = "incomplete";
  } else if (any(Verdict::kScaled)) {
    report.verdict = "scaled";
  } else {
    report.verdict = "match";
  }
  if (report.verdict == "match") {
    report.summary = "all " + std::to_string(report.params.size()) + " parameters match";
  } else if (!report.groups.empty()) {
    report.summary = report.groups.front().explanation;
  }
  return report;
}

Expected<Report> RunDiff(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options) {
  LoadOptions lo;
  lo.threads = options.threads;
  Progress reading("gradtrace-diff: reading", options.progress);
  if (options.progress) {
    lo.progress = [&reading](uint64_t done, uint64_t total) {
      if (Progress::Wanted(total)) reading.Update(done, total);
    };
  }
  auto a = TraceSet::Load(a_dir, lo);
  if (!a.ok()) return a.status();
  auto b = TraceSet::Load(b_dir, lo);
  if (!b.ok()) return b.status();
  if (!options.noise_dir.empty()) {
    auto n = TraceSet::Load(options.noise_dir, lo);
    if (!n.ok()) return n.status();
    reading.Finish();
    return DiffSets(*a, *b, options, &*n);
  }
  reading.Finish();
  return DiffSets(*a, *b, options, nullptr);
}

}  // namespace gradtrace::diff
