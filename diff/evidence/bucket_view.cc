#include "evidence/bucket_view.h"

#include <algorithm>
#include <cmath>
#include <mutex>
#include <string>

#include "load/thread_pool.h"

namespace gradtrace::diff {

double SquaredNorm(const SideValues& v) {
  double s = 0;
  if (v.has_full()) {
    v.WithDense([&](const auto& dense) {
      for (int64_t e = 0; e < v.numel; ++e) {
        if (v.filled[e]) s += static_cast<double>(dense[e]) * static_cast<double>(dense[e]);
      }
    });
  } else if (!v.sparse.empty()) {
    for (const auto& [pos, val] : v.sparse) s += val * val;
  } else if (v.has_stats) {
    s = v.stats_sums_only ? std::nan("") : v.moments.sum_sq;
  }
  return s;
}

BucketCell FinishCell(const CellSums& sums, double rtol, double ctol, BucketCell cell) {
  cell.params = sums.params;
  cell.compared = sums.compared;
  cell.pre_norm = std::sqrt(sums.pre_sq);
  cell.post_norm = std::sqrt(sums.post_sq);
  if (sums.sp == 0 || sums.ss == 0) {
    cell.divisor = std::nan("");
    cell.residual = std::nan("");
  } else {
    cell.divisor = sums.ss / sums.sp;
    const double res2 = std::max(0.0, sums.pp - sums.sp * sums.sp / sums.ss);
    cell.residual = sums.pp > 0 ? std::sqrt(res2 / sums.pp) : 0;
  }
  if (!std::isfinite(cell.divisor)) {
    cell.verdict = SelfVerdict::kMissing;
  } else if (cell.residual > std::max(rtol, 1e-6)) {
    cell.verdict = SelfVerdict::kInconsistent;
  } else if (cell.expected > 0 && std::fabs(cell.divisor - cell.expected) > ctol * cell.expected) {
    cell.verdict = SelfVerdict::kWrongDivisor;
  }
  return cell;
}

std::vector<std::vector<int32_t>> BatchParams(const TraceSet& set, const std::vector<int32_t>& ids, int64_t max_elems) {
  std::vector<std::vector<int32_t>> out;
  int64_t held = 0;
  for (int32_t id : ids) {
    const int64_t n = set.run().params(id).numel();
    if (out.empty() || (held > 0 && held + n > max_elems)) {
      out.emplace_back();
      held = 0;
    }
    out.back().push_back(id);
    held += n;
  }
  return out;
}

namespace {

// One rank's frames of the step: POST_REDUCE by micro-step, and FINAL.
struct RankFrames {
  std::map<int32_t, std::vector<const FrameRef*>> post;  // micro-step -> frames
  std::vector<const FrameRef*> final;
  std::map<int32_t, std::set<int32_t>> micros;  // parameter id -> micro-steps with POST_REDUCE
};

// Frames of `rank` only, in the per-rank layout GatherParams takes.
FramesOfRanks OnRank(int rank, std::vector<const FrameRef*> frames) { return {{rank, std::move(frames)}}; }

// FINAL against the last POST_REDUCE and against their sum, per parameter of `ids`.
Status DetectOnRank(const TraceSet& set, int rank, const RankFrames& rf, const std::vector<int32_t>& ids, double rtol,
                    ReaderCache* cache, std::vector<int32_t>* accumulating) {
  std::vector<SideValues> fin;
  Status st = GatherParams(set, OnRank(rank, rf.final), ids, Combine::kReplicas, cache, &fin);
  if (!st.ok()) return st;
  std::map<int32_t, std::vector<SideValues>> post;
  for (const auto& [micro, frames] : rf.post) {
    st = GatherParams(set, OnRank(rank, frames), ids, Combine::kReplicas, cache, &post[micro]);
    if (!st.ok()) return st;
  }
  for (size_t i = 0; i < ids.size(); ++i) {
    const SideValues& f = fin[i];
    const int32_t last = *rf.micros.at(ids[i]).rbegin();
    const SideValues& pl = post[last][i];
    if (!f.has_full() || !pl.has_full()) continue;
    double e_last = 0, e_sum = 0, f2 = 0;
    for (int64_t e = 0; e < f.numel; ++e) {
      if (!f.filled[e] || !pl.filled[e]) continue;
      double sum = 0;
      for (const auto& [micro, values] : post) {
        if (values[i].has_full() && values[i].filled[e]) sum += values[i].at(e);
      }
      const double fv = f.at(e);
      e_last += (fv - pl.at(e)) * (fv - pl.at(e));
      e_sum += (fv - sum) * (fv - sum);
      f2 += fv * fv;
    }
    const double bound = rtol * rtol * f2;
    if (f2 > 0 && e_last <= bound && e_sum > bound) accumulating->push_back(ids[i]);
  }
  return Status::Ok();
}

std::string JoinInts(const std::set<int>& v) {
  std::string s;
  for (int x : v) s += (s.empty() ? "" : ", ") + std::to_string(x);
  return s;
}

}  // namespace

Expected<std::set<std::pair<int, int32_t>>> AccumulatingParams(const TraceSet& set, int64_t step, double rtol,
                                                               int threads) {
  std::vector<RankFrames> ranks(set.world());
  for (const FrameRef& f : set.frames()) {
    if (f.step != step || f.rank < 0 || f.rank >= set.world()) continue;
    RankFrames& rf = ranks[f.rank];
    if (f.phase == pb::FINAL) rf.final.push_back(&f);
    if (f.phase != pb::POST_REDUCE) continue;
    rf.post[f.micro_step].push_back(&f);
    for (int32_t id : f.param_ids) rf.micros[id].insert(f.micro_step);
  }
  std::set<std::pair<int, int32_t>> out;
  const int workers = ResolveThreads(threads);
  std::vector<ReaderCache> caches(workers);
  std::mutex mu;
  Status first_error;
  ParallelFor(ranks.size(), workers, [&](size_t r, int worker) {
    const RankFrames& rf = ranks[r];
    if (rf.final.empty()) return;
    std::set<int32_t> in_final;
    for (const FrameRef* f : rf.final) in_final.insert(f->param_ids.begin(), f->param_ids.end());
    std::vector<int32_t> ids;
    for (const auto& [id, micros] : rf.micros) {
      if (micros.size() > 1 && in_final.count(id)) ids.push_back(id);
    }
    std::vector<int32_t> found;
    // A batch holds FINAL and every micro-step's POST of its parameters: 4M elements bound it.
    for (const auto& batch : BatchParams(set, ids, int64_t{1} << 22)) {
      Status st = DetectOnRank(set, static_cast<int>(r), rf, batch, rtol, &caches[worker], &found);
      if (!st.ok()) {
        std::lock_guard<std::mutex> lock(mu);
        if (first_error.ok()) first_error = std::move(st);
        return;
      }
    }
    std::lock_guard<std::mutex> lock(mu);
    for (int32_t id : found) out.insert({static_cast<int>(r), id});
  });
  if (!first_error.ok()) return first_error;
  return out;
}

std::string AccumulationFinding(const std::vector<BucketCell>& cells) {
  std::set<int> buckets, micros, ranks;
  for (const BucketCell& c : cells) {
    if (!c.accumulates) continue;
    buckets.insert(c.bucket);
    micros.insert(c.micro);
    ranks.insert(c.rank);
  }
  if (buckets.empty()) return "";
  return std::string(buckets.size() == 1 ? "bucket " : "buckets ") + JoinInts(buckets) +
         (buckets.size() == 1 ? " accumulates" : " accumulate") + " across micro-steps: PRE_REDUCE of micro-step " +
         JoinInts(micros) + " contains the previous micro-step's reduced gradient (ranks " + JoinInts(ranks) +
         ": FINAL is the last POST_REDUCE, not the sum over micro-steps, as with DDP outside no_sync). Each "
         "reduction is checked on its own, so the divisors stand; --phase post/pre diffs, which sum micro-steps, do "
         "not apply to this set (compare FINAL)";
}

}  // namespace gradtrace::diff
