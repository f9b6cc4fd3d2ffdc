#include "evidence/self_check.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <set>
#include <tuple>

#include "cause.h"
#include "compare/align.h"
#include "compare/tolerance.h"
#include "divisor_finding.h"
#include "evidence/bucket_view.h"
#include "evidence/grad_norm.h"
#include "expected_divisor.h"
#include "explain/explain.h"
#include "explain/self_judge.h"
#include "load/gather.h"
#include "load/progress.h"
#include "load/thread_pool.h"

namespace gradtrace::diff {
namespace {

// One reduction: a bucket of one micro-step, reduced over one group.
struct ReductionKey {
  int32_t micro = 0;
  int32_t bucket = 0;
  std::string group;
  std::vector<int> members;
  bool operator<(const ReductionKey& o) const {
    return std::tie(micro, bucket, group, members) < std::tie(o.micro, o.bucket, o.group, o.members);
  }
};

// Accumulators are per parameter and group: a parameter reduced over two groups in one step (a
// norm summed over tp, then averaged over dp) has two reductions with divisors of their own.
using AccKey = std::pair<int32_t, std::string>;

struct Reduction {
  std::vector<const FrameRef*> post;  // members' POST frames
  std::set<int32_t> sample;           // when not empty, only these parameters are measured (SampleReductions)
};

}  // namespace

namespace {

// The reductions of one step: each (micro, bucket, group) with its members'
// POST frames, and the PRE frames of every (rank, micro, bucket).
struct StepReductions {
  std::map<ReductionKey, Reduction> reductions;
  std::map<std::tuple<int, int32_t, int32_t>, std::vector<const FrameRef*>> pre;
};

// The ranks a POST_REDUCE of `group` on `rank` sums over: the group's members,
// and under HSDP (Config.replicate > 1, FORMAT.md 4.1) each member's replicas,
// since POST is written after the all-reduce over the replicate group.
std::vector<int> ReductionMembers(const TraceSet& set, int rank, const std::string& group) {
  const std::vector<int>& members = set.GroupMembers(rank, group);
  if (!semantics::SumsOverReplicas(set.config(), group)) return members;
  std::set<int> all(members.begin(), members.end());
  for (int m : members) {
    const auto& replicas = set.GroupMembers(m, "replicate");
    all.insert(replicas.begin(), replicas.end());
  }
  return {all.begin(), all.end()};
}

StepReductions CollectReductions(const TraceSet& set, int64_t step, Report* report) {
  StepReductions out;
  for (const FrameRef& f : set.frames()) {
    if (f.step != step) continue;
    if (f.phase == pb::PRE_REDUCE) out.pre[{f.rank, f.micro_step, f.bucket_id}].push_back(&f);
    if (f.phase != pb::POST_REDUCE) continue;
    ReductionKey key{f.micro_step, f.bucket_id, f.group, ReductionMembers(set, f.rank, f.group)};
    if (key.members.empty()) {
      report->findings.push_back({"divisor", set.ranks()[f.rank].path + ": POST_REDUCE of bucket " +
                                                 std::to_string(f.bucket_id) + " names group '" + f.group +
                                                 "' which this rank's RunInfo does not list; skipped"});
      continue;
    }
    out.reductions[key].post.push_back(&f);
  }
  return out;
}

// The parameters of one bucket to measure: the smallest of at least
// kSampleMinNumel elements held wholly by the PRE frame (~4 MB) that holds the
// most parameters, at most kSampleParams of them and, past the
// kSampleMinParams-th, only while they hold kSampleElements together, so each
// member decompresses about one frame and sums a few thousand elements (a
// frame's one 512x512 weight among its biases was 99 % of the evidence's sums:
// docs/dev/performance.md); then, for each parameter kind the bucket holds that is
// not among them, the parameter of that kind spread over the fewest frames.
// Several parameters, so that one whose gradient is zero up to rounding (its
// divisor is noise) does not move the median.
constexpr size_t kSampleParams = 8;
constexpr size_t kSampleMinParams = 3;
constexpr int64_t kSampleElements = 16384;
constexpr int64_t kSampleMinNumel = 64;

std::set<int32_t> SampleParams(const TraceSet& set, const std::vector<const FrameRef*>& frames) {
  std::map<int32_t, int> spread;  // parameter -> how many of these frames hold a slice of it
  for (const FrameRef* f : frames) {
    for (int32_t id : f->param_ids) ++spread[id];
  }
  std::set<int32_t> sample;
  size_t best = 0;
  for (const FrameRef* f : frames) {  // frames in offset order: the first of equals wins
    std::set<int32_t> whole;
    for (int32_t id : f->param_ids) {
      if (spread[id] == 1) whole.insert(id);
    }
    if (whole.size() > best) best = whole.size(), sample = std::move(whole);
  }
  auto numel = [&](int32_t id) { return id >= 0 && id < set.run().params_size() ? set.run().params(id).numel() : 0; };
  std::vector<int32_t> by_size(sample.begin(), sample.end());
  std::stable_sort(by_size.begin(), by_size.end(), [&](int32_t x, int32_t y) {
    const bool x_big = numel(x) >= kSampleMinNumel, y_big = numel(y) >= kSampleMinNumel;
    return x_big != y_big ? x_big : numel(x) < numel(y);  // large enough first, then the smallest
  });
  size_t keep = 0;
  for (int64_t held = 0; keep < by_size.size() && keep < kSampleParams; ++keep) {
    held += numel(by_size[keep]);
    if (keep >= kSampleMinParams && held > kSampleElements) break;
  }
  by_size.resize(keep);
  sample = std::set<int32_t>(by_size.begin(), by_size.end());
  auto kind = [&](int32_t id) { return id >= 0 && id < set.run().params_size() ? set.run().params(id).kind() : 0; };
  std::map<int, int32_t> fewest;  // kind -> its parameter over the fewest frames
  for (const auto& [id, n] : spread) {
    auto it = fewest.find(kind(id));
    if (it == fewest.end() || n < spread[it->second]) fewest[kind(id)] = id;
  }
  std::set<int> covered;
  for (int32_t id : sample) covered.insert(kind(id));
  for (const auto& [k, id] : fewest) {
    if (!covered.count(k)) sample.insert(id);
  }
  return sample;
}

// The diff's evidence (SelfOptions.sample) needs one divisor per parameter kind,
// not every element's: a full --self pass doubled a two-set diff's time and
// memory (docs/dev/performance.md). The divisor is a bucket's, so its parameters
// agree on it: SampleReductions keeps the first micro-step's reductions and, in
// each, the parameters of one PRE frame of the first member (SampleParams), and
// one member's POST where POST holds the whole bucket (a ZeRO partition keeps
// every member's part). The evidence reports the median over them.
void SampleReductions(const TraceSet& set, StepReductions* step) {
  if (step->reductions.empty()) return;
  const int32_t first_micro = step->reductions.begin()->first.micro;  // keys order by micro-step first
  std::map<ReductionKey, Reduction> kept;
  for (auto& [key, reduction] : step->reductions) {
    if (key.micro != first_micro || key.members.empty()) continue;
    auto pre = step->pre.find({key.members.front(), key.micro, key.bucket});
    if (pre == step->pre.end()) continue;
    std::vector<const FrameRef*> frames = pre->second;
    std::sort(frames.begin(), frames.end(), [](const FrameRef* x, const FrameRef* y) { return x->offset < y->offset; });
    Reduction r;
    r.sample = SampleParams(set, frames);
    const bool partitioned = std::any_of(reduction.post.begin(), reduction.post.end(),
                                         [](const FrameRef* f) { return f->partition_count > 0; });
    int keep_rank = -1;
    for (const FrameRef* f : reduction.post) {
      const bool holds =
          std::any_of(f->param_ids.begin(), f->param_ids.end(), [&](int32_t id) { return r.sample.count(id) > 0; });
      if (holds && (partitioned || keep_rank < 0 || f->rank == keep_rank)) {
        if (!partitioned) keep_rank = f->rank;
        r.post.push_back(f);
      }
    }
    kept.emplace(key, std::move(r));
  }
  step->reductions = std::move(kept);
}

// Adds <S,S>, <S,P>, <P,P> of one POST record against the PRE sum S of its
// reduction to `acc` and to the record's bucket-view `cell`; returns the
// elements the record holds.
int64_t AccumulatePost(const std::vector<int32_t>& ids, const std::vector<SideValues>& sums,
                       const std::vector<SideValues>& held, const ReductionKey& key, const FrameRef& post,
                       std::map<AccKey, ReductionSums>* acc, CellSums* cell) {
  int64_t held_total = 0;
  for (size_t k = 0; k < ids.size(); ++k) {
    const SideValues& s = sums[k];
    const SideValues& p = held[k];
    if (p.ranks == 0) continue;
    ReductionSums& a = (*acc)[{ids[k], key.group}];
    a.buckets.insert(key.bucket);
    a.group = key.group;
    a.group_size = static_cast<int>(key.members.size());
    if (post.divisor > 0) a.declared = post.divisor;
    cell->post_sq += SquaredNorm(p);
    ++cell->params;
    auto add = [&](double sv, double pv) {
      a.ss += sv * sv;
      a.sp += sv * pv;
      a.pp += pv * pv;
      ++a.compared;
      cell->ss += sv * sv;
      cell->sp += sv * pv;
      cell->pp += pv * pv;
      ++cell->compared;
    };
    if (p.has_full() && s.has_full()) {
      for (int64_t e = 0; e < p.numel; ++e) {
        if (!p.filled[e]) continue;
        ++held_total;
        if (s.filled[e]) add(s.at(e), p.at(e));
      }
    } else if (!p.sparse.empty()) {
      for (const auto& [pos, pv] : p.sparse) {
        auto it = s.sparse.find(pos);
        if (it != s.sparse.end())
          add(it->second, pv);
        else if (s.has_full() && s.filled[pos])
          add(s.at(pos), pv);
      }
    } else if (p.has_stats && s.has_stats) {
      add(s.moments.sum, p.moments.sum);  // sums only: exact when POST covers what PRE summed
    }
  }
  return held_total;
}

// What every reduction of one pass reads and is judged by.
struct ReductionPass {
  const TraceSet& set;
  const StepReductions& step;
  const std::set<std::pair<int, int32_t>>& accumulating;  // (rank, parameter) whose bucket accumulates
  double rtol = 0, ctol = 0;
};

// The PRE frames a reduction sums: each member's, holding the parameters measured.
struct PreInputs {
  std::map<int, std::vector<const FrameRef*>> frames;  // ascending rank: the order the sum is taken in
  std::set<int32_t> ids;                               // parameters measured (the sample's, when sampled)
  int missing_member = -1;                             // a member without PRE of the bucket, if any
};

PreInputs CollectPreInputs(const ReductionPass& pass, const ReductionKey& key, const std::set<int32_t>& sample) {
  PreInputs in;
  for (int m : key.members) {
    if (m < 0 || m >= pass.set.world()) continue;
    auto it = pass.step.pre.find({m, key.micro, key.bucket});
    if (it == pass.step.pre.end()) {
      in.missing_member = m;
      continue;
    }
    // PRE frames of this group when the rank's bucket id names several (the same id for two groups).
    const bool by_group =
        std::any_of(it->second.begin(), it->second.end(), [&](const FrameRef* f) { return f->group == key.group; });
    for (const FrameRef* f : it->second) {
      if (by_group && f->group != key.group) continue;
      bool wanted = false;
      for (int32_t id : f->param_ids) {
        if (sample.empty() || sample.count(id)) in.ids.insert(id), wanted = true;
      }
      if (wanted) in.frames[m].push_back(f);
    }
  }
  return in;
}

// The sum S of PRE over a reduction's members, per parameter, with what the cells and the
// model-parallel check need besides.
struct PreSum {
  std::vector<int32_t> ids;
  std::vector<SideValues> sums;      // S, per parameter of `ids`
  std::map<int, double> pre_sq;      // member -> its ||PRE||^2
  std::vector<char> model_parallel;  // per parameter: reduced over a model-parallel group
  // Model-parallel parameters: ||S||^2 and n x the sum of the members' ||PRE||^2 (ReductionSums.sum_sq).
  std::vector<double> sum_sq, members_sq;
  bool identical = false;  // the members' inputs were the same values (IdenticalInputs over all of them)
};

// One member at a time (as GatherParams sums ranks), for each member's norm.
Status SumPre(const ReductionPass& pass, const ReductionKey& key, const PreInputs& in, ReaderCache* cache,
              PreSum* out) {
  const TraceSet& set = pass.set;
  out->ids.assign(in.ids.begin(), in.ids.end());
  const size_t n = out->ids.size();
  out->sums.assign(n, SideValues());
  out->model_parallel.assign(n, 0);
  out->sum_sq.assign(n, 0);
  out->members_sq.assign(n, 0);
  for (size_t i = 0; i < n; ++i) {
    out->model_parallel[i] = semantics::ModelParallelReduction(set.run().params(out->ids[i]), key.group);
  }
  for (const auto& [m, frames] : in.frames) {
    const FramesOfRanks one{{m, frames}};
    std::vector<SideValues> mine;
    GT_RETURN_IF_ERROR(GatherParams(set, one, out->ids, Combine::kSum, cache, &mine));
    for (size_t i = 0; i < mine.size(); ++i) {
      if (mine[i].ranks == 0) continue;
      const double sq = SquaredNorm(mine[i]);
      out->pre_sq[m] += sq;
      if (out->model_parallel[i]) out->members_sq[i] += sq;
      MergeRank(m, 0, std::move(mine[i]), Combine::kSum, &out->sums[i]);
    }
  }
  for (size_t i = 0; i < n; ++i) out->sums[i].numel = set.run().params(out->ids[i]).numel();
  double all_sum_sq = 0, all_members_sq = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!out->model_parallel[i]) continue;
    out->sum_sq[i] = SquaredNorm(out->sums[i]);
    out->members_sq[i] *= static_cast<double>(key.members.size());
    all_sum_sq += out->sum_sq[i];
    all_members_sq += out->members_sq[i];
  }
  out->identical = IdenticalInputs(all_sum_sq, all_members_sq, pass.rtol);
  return Status::Ok();
}

// The bucket-view cell of one member's POST record, before its sums: where it sits, the divisor the
// bucket needs and whether the bucket accumulates across micro-steps.
BucketCell CellOf(const ReductionPass& pass, const ReductionKey& key, const FrameRef& post, bool identical) {
  const TraceSet& set = pass.set;
  BucketCell c;
  c.rank = post.rank;
  c.micro = key.micro;
  c.bucket = key.bucket;
  c.group = key.group;
  c.group_size = static_cast<int>(key.members.size());
  // The divisor the bucket needs (semantics/expected_divisor.h), from one of its parameters: one
  // reduced over a model-parallel group if any, else an expert (the experts' divisor), else any.
  const pb::ParamInfo* info = nullptr;
  int best = -1;
  for (int32_t id : post.param_ids) {
    const pb::ParamInfo& p = set.run().params(id);
    const int rank = semantics::ModelParallelReduction(p, key.group) ? 2 : p.kind() == pb::EXPERT ? 1 : 0;
    if (rank > best) best = rank, info = &p;
  }
  c.expected = info != nullptr
                   ? semantics::ExpectedDivisorOver(set.config(), *info, {key.group, c.group_size, identical})
                   : semantics::ExpectedDivisor(set.config(), pb::DENSE, c.group_size);
  c.accumulates = key.micro > 0 && std::any_of(post.param_ids.begin(), post.param_ids.end(), [&](int32_t id) {
                    return pass.accumulating.count({post.rank, id}) > 0;
                  });
  return c;
}

// What checking one reduction adds to the report.
struct ReductionResult {
  std::map<AccKey, ReductionSums> acc;
  std::vector<BucketCell> cells;
  std::vector<Finding> findings;
};

// A member sent no PRE of the bucket: every parameter of the POST records gets the problem, every
// record an unread cell.
void MarkUnchecked(const ReductionPass& pass, const ReductionKey& key, const Reduction& reduction, int missing_member,
                   ReductionResult* out) {
  for (const FrameRef* f : reduction.post) {
    for (int32_t id : f->param_ids) {
      out->acc[{id, key.group}].problems.push_back("no PRE_REDUCE of bucket " + std::to_string(key.bucket) +
                                                   " from rank " + std::to_string(missing_member));
    }
    CellSums none;
    none.pre_sq = none.post_sq = std::nan("");  // not read: the reduction cannot be checked
    out->cells.push_back(FinishCell(none, pass.rtol, pass.ctol, CellOf(pass, key, *f, false)));
  }
}

// One reduction: the PRE sum over the group's members against each member's POST.
Status CheckReduction(const ReductionPass& pass, const ReductionKey& key, const Reduction& reduction,
                      ReaderCache* cache, ReductionResult* out) {
  const TraceSet& set = pass.set;
  const PreInputs in = CollectPreInputs(pass, key, reduction.sample);
  if (in.missing_member >= 0) {
    MarkUnchecked(pass, key, reduction, in.missing_member, out);
    return Status::Ok();
  }
  PreSum pre;
  GT_RETURN_IF_ERROR(SumPre(pass, key, in, cache, &pre));
  for (const FrameRef* post : reduction.post) {
    const FramesOfRanks post_frames{{post->rank, {post}}};
    std::vector<SideValues> held;
    GT_RETURN_IF_ERROR(GatherParams(set, post_frames, pre.ids, Combine::kReplicas, cache, &held));
    CellSums cell;
    cell.pre_sq = pre.pre_sq[post->rank];
    const int64_t held_total = AccumulatePost(pre.ids, pre.sums, held, key, *post, &out->acc, &cell);
    out->cells.push_back(FinishCell(cell, pass.rtol, pass.ctol, CellOf(pass, key, *post, pre.identical)));
    // ZeRO-1/2: the partition the record declares must be what its slices hold (a sampled reduction
    // measures only some of them).
    if (reduction.sample.empty() && post->partition_count > 0 && held_total > 0 &&
        held_total != post->partition_count) {
      out->findings.push_back({"divisor", set.ranks()[post->rank].path + ": POST_REDUCE of bucket " +
                                              std::to_string(key.bucket) + " declares a partition of " +
                                              std::to_string(post->partition_count) + " elements but holds " +
                                              std::to_string(held_total)});
    }
  }
  for (size_t i = 0; i < pre.ids.size(); ++i) {
    auto it = pre.model_parallel[i] ? out->acc.find({pre.ids[i], key.group}) : out->acc.end();
    if (it == out->acc.end()) continue;
    it->second.sum_sq += pre.sum_sq[i];
    it->second.members_sq += pre.members_sq[i];
  }
  return Status::Ok();
}

// Every reduction in parallel (CheckReduction). Returns the accumulators per (parameter id, group);
// appends one bucket-view cell per member's POST record to report->bucket_view (cells of a micro-step
// > 0 whose parameters `accumulating` lists for the rank are marked), and the reductions' findings.
Expected<std::map<AccKey, ReductionSums>> AccumulateReductions(const TraceSet& set, const StepReductions& step,
                                                               const SelfOptions& options,
                                                               const std::set<std::pair<int, int32_t>>& accumulating,
                                                               Report* report) {
  std::vector<std::pair<ReductionKey, Reduction>> work(step.reductions.begin(), step.reductions.end());
  const int threads = ResolveThreads(options.threads);
  // A sample reads each frame once (one member's POST, no replicas to find by their bytes): nothing is worth
  // keeping, and each frame kept was a fresh buffer (page faults) where the last one's would do.
  std::vector<ReaderCache> caches;
  caches.reserve(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) caches.emplace_back(options.sample ? 0 : ReaderCache::kDefaultFrameBudget);
  std::vector<ReductionResult> results(work.size());
  const ReductionPass pass{set, step, accumulating, report->tolerance.rtol, ClusterTolerance(report->tolerance.rtol)};
  std::mutex mu;
  Status first_error;
  Progress progress("gradtrace-diff: self-check", options.progress && Progress::Wanted(set.total_bytes()));
  std::atomic<size_t> done{0};
  ParallelFor(work.size(), threads, [&](size_t w, int worker) {
    Status st = CheckReduction(pass, work[w].first, work[w].second, &caches[worker], &results[w]);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = std::move(st);
      return;
    }
    progress.Update(done.fetch_add(1) + 1, work.size());
  });
  progress.Finish();
  if (!first_error.ok()) return first_error;
  std::map<AccKey, ReductionSums> total;
  for (ReductionResult& r : results) {
    for (auto& [k, acc] : r.acc) total[k].Merge(acc);
    report->bucket_view.insert(report->bucket_view.end(), r.cells.begin(), r.cells.end());
    report->findings.insert(report->findings.end(), r.findings.begin(), r.findings.end());
  }
  std::sort(report->bucket_view.begin(), report->bucket_view.end(), [](const BucketCell& x, const BucketCell& y) {
    return std::tie(x.rank, x.micro, x.bucket, x.group) < std::tie(y.rank, y.micro, y.bucket, y.group);
  });
  return total;
}

// What --self cannot see, said in every self report: it checks each reduction
// against its own inputs and the layout, never the gradient itself.
constexpr char kSelfScope[] =
    "--self checks each reduction against its own inputs and replicas against each other; it cannot see a loss "
    "scaled before backward beyond what the recorded loss recipe states (e.g. an unrecorded local mean per "
    "sequence shard, #5248), wrong data or weights, or a wrong forward: diff against a reference run for those";

// The step's FINAL, read once for both checks that need it: the replicas that
// disagree beyond rtol (into `disagreements`, when not null) and the norm of the
// gradients (into `norm`, when not null). Each was a VisitFinal pass of its own.
Status ReadFinal(const TraceSet& set, int64_t step, double rtol, int threads,
                 std::map<int32_t, ReplicaDisagreement>* disagreements, FinalNormSum* norm) {
  std::mutex mu;
  return VisitFinal(set, step, threads, [&](const std::vector<int32_t>& ids, const std::vector<SideValues>& vs) {
    if (norm != nullptr) norm->Add(ids, vs);
    if (disagreements == nullptr) return;
    for (size_t i = 0; i < ids.size(); ++i) {
      const SideValues& v = vs[i];
      const double rel =
          v.replica_ref2 > 0 ? std::sqrt(v.replica_diff2 / v.replica_ref2) : (v.replica_diff2 > 0 ? 1.0 : 0.0);
      if (rel <= rtol) continue;
      std::lock_guard<std::mutex> lock(mu);
      (*disagreements)[ids[i]] = {rel, v.replica_rank, v.replica_other};
    }
  });
}

}  // namespace

namespace {

// The report's head: the one side (A), and the tolerance of --rtol or the dtype/summand bound.
Report SelfReport(const TraceSet& set, const SelfOptions& options) {
  Report report = SelfReportHead(set.run(), set.world(), options.rtol);
  report.a.dir = set.dir();
  report.a.truncated = set.truncated();
  return report;
}

// The step a self-check reads.
struct SelfStep {
  int64_t step = 0;
  // No PRE_REDUCE and POST_REDUCE records, only FINAL (DTensor reductions happen inside autograd):
  // its replicas are all there is to check.
  bool final_only = false;
};

// options.step, else the first step with POST_REDUCE (FINAL for a FINAL-only set); InvalidArgument
// naming what the set lacks.
Expected<SelfStep> PickSelfStep(const TraceSet& set, const SelfOptions& options) {
  auto post_steps = StepsWithPhase(set, pb::POST_REDUCE);
  auto pre_steps = StepsWithPhase(set, pb::PRE_REDUCE);
  const auto final_steps = StepsWithPhase(set, pb::FINAL);
  const bool final_only = (post_steps.empty() || pre_steps.empty()) && options.replicas && !final_steps.empty();
  if (final_only) post_steps = final_steps;
  if ((post_steps.empty() || pre_steps.empty()) && !final_only) {
    return Status::InvalidArgument(set.dir() + ": --self needs PRE_REDUCE and POST_REDUCE records (this set has " +
                                   std::string(pre_steps.empty() ? "no PRE_REDUCE" : "no POST_REDUCE") + ")");
  }
  const int64_t step = options.step ? *options.step : post_steps.front();
  if (!std::binary_search(post_steps.begin(), post_steps.end(), step)) {
    return Status::InvalidArgument(set.dir() + ": no " + (final_only ? "FINAL" : "POST_REDUCE") + " records for step " +
                                   std::to_string(step));
  }
  return SelfStep{step, final_only};
}

// Every reduction of the step measured: the sums per parameter and group and the accumulating parameters
// into `m`, the bucket view and the measuring's findings into the report.
Status MeasureReductions(const TraceSet& set, const SelfOptions& options, const SelfStep& at, Report* report,
                         SelfMeasurements* m) {
  const double rtol = report->tolerance.rtol;
  StepReductions reductions = at.final_only ? StepReductions{} : CollectReductions(set, at.step, report);
  if (options.sample) SampleReductions(set, &reductions);
  std::set<std::pair<int, int32_t>> accumulating;
  if (options.accumulation) {
    auto found = AccumulatingParams(set, at.step, rtol, options.threads);
    if (!found.ok()) return found.status();
    accumulating = std::move(*found);
  }
  auto total = AccumulateReductions(set, reductions, options, accumulating, report);
  if (!total.ok()) return total.status();
  m->reductions = std::move(*total);
  for (const auto& [rank, id] : accumulating) m->accumulating.insert(id);
  return Status::Ok();
}

// The notes every self report carries: the set's inferences, what --self cannot see, its truncated files.
void AddSelfNotes(const TraceSet& set, std::vector<std::pair<std::string, std::string>>* notes) {
  for (const std::string& n : set.inferences()) notes->emplace_back("note", n);
  notes->emplace_back("note", kSelfScope);
  for (const RankFile& f : set.ranks()) {
    if (f.truncated) {
      notes->emplace_back("truncated",
                          f.truncation + "; frames after offset " + std::to_string(f.stop_offset) + " are missing");
    }
  }
}

}  // namespace

uint64_t SampledBytes(const TraceSet& set, int64_t step) {
  Report unused;  // the catalogue's findings: SelfCheckSet reports them
  StepReductions reductions = CollectReductions(set, step, &unused);
  SampleReductions(set, &reductions);
  const std::set<std::pair<int, int32_t>> none;
  const ReductionPass pass{set, reductions, none};
  std::set<const FrameRef*> read;
  for (const auto& [key, reduction] : reductions.reductions) {
    for (const auto& [member, frames] : CollectPreInputs(pass, key, reduction.sample).frames) {
      read.insert(frames.begin(), frames.end());
    }
    read.insert(reduction.post.begin(), reduction.post.end());
  }
  uint64_t bytes = 0;
  for (const FrameRef* f : read) bytes += f->raw_bytes;
  return bytes;
}

Expected<Report> SelfCheckSet(const TraceSet& set, const SelfOptions& options) {
  Report report = SelfReport(set, options);
  const double rtol = report.tolerance.rtol;
  auto at = PickSelfStep(set, options);
  if (!at.ok()) return at.status();
  report.step = at->step;
  if (at->final_only) {
    report.findings.push_back({"note",
                               "no PRE_REDUCE and POST_REDUCE records: only the replicas of FINAL are "
                               "checked, no divisor is measured"});
  }
  SelfMeasurements m;
  m.final_only = at->final_only;
  m.truncated = set.truncated();
  GT_RETURN_IF_ERROR(MeasureReductions(set, options, *at, &report, &m));
  // FINAL feeds the replica check and, when the set reported a norm, the grad-norm check: one read for both.
  if (options.grad_norm) m.reported_norm = ReportedGradNorm(set, at->step);
  FinalNormSum final_norm;
  if (options.replicas || m.reported_norm) {
    GT_RETURN_IF_ERROR(ReadFinal(set, at->step, rtol, options.threads, options.replicas ? &m.replicas : nullptr,
                                 m.reported_norm ? &final_norm : nullptr));
  }
  if (m.reported_norm) m.final_norm = final_norm.Norm();
  AddSelfNotes(set, &m.notes);
  JudgeSelf(set.run(), m, &report);
  return report;
}

namespace {

LoadOptions Loading(const SelfOptions& options) {
  LoadOptions lo;
  lo.threads = options.threads;
  return lo;
}

}  // namespace

Expected<Report> RunSelfCheck(const std::string& dir, const SelfOptions& options) {
  auto set = TraceSet::Load(dir, Loading(options));
  if (!set.ok()) return set.status();
  return SelfCheckSet(*set, options);
}

namespace {

// Steps with reductions to check, else (a FINAL-only set) the steps with FINAL.
std::vector<int64_t> SelfSteps(const TraceSet& set, const SelfOptions& options) {
  const auto post = StepsWithPhase(set, pb::POST_REDUCE), pre = StepsWithPhase(set, pb::PRE_REDUCE);
  std::vector<int64_t> both;
  std::set_intersection(post.begin(), post.end(), pre.begin(), pre.end(), std::back_inserter(both));
  if (both.empty() && options.replicas && (post.empty() || pre.empty())) return StepsWithPhase(set, pb::FINAL);
  return both;
}

}  // namespace

Expected<StepTable> SelfCheckAllSteps(const TraceSet& set, const SelfOptions& options) {
  const std::vector<int64_t> steps = SelfSteps(set, options);
  if (steps.empty()) return SelfCheckSet(set, options).status();  // its message says what is missing
  StepTable t;
  t.verdict = "ok";
  Progress progress("gradtrace-diff --self: steps",
                    options.progress && steps.size() > 1 && Progress::Wanted(set.total_bytes()));
  for (size_t i = 0; i < steps.size(); ++i) {
    SelfOptions o = options;
    o.step = steps[i];
    o.progress = false;
    auto r = SelfCheckSet(set, o);
    if (!r.ok()) return r.status();
    if (t.verdict == "ok" && r->ExitCode() != 0) t.verdict = r->verdict;
    t.steps.push_back(std::move(*r));
    progress.Update(i + 1, steps.size());
  }
  progress.Finish();
  const Report* first = t.FirstDifference();
  const auto bad = std::count_if(t.steps.begin(), t.steps.end(), [](const Report& r) { return r.ExitCode() != 0; });
  t.summary = first == nullptr
                  ? "all " + std::to_string(t.steps.size()) + " steps ok"
                  : std::to_string(bad) + " of " + std::to_string(t.steps.size()) +
                        " steps are not ok, the first at step " + std::to_string(first->step) + ": " + first->summary;
  return t;
}

Expected<Report> SelfCheckSteps(const TraceSet& set, const SelfOptions& options) {
  if (options.step) return SelfCheckSet(set, options);
  auto table = SelfCheckAllSteps(set, options);
  if (!table.ok()) return table.status();
  return ReportOfSteps(std::move(*table), "with reductions (or FINAL) recorded");
}

Expected<Report> RunSelfCheckSteps(const std::string& dir, const SelfOptions& options) {
  auto set = TraceSet::Load(dir, Loading(options));
  if (!set.ok()) return set.status();
  return SelfCheckSteps(*set, options);
}

Expected<StepTable> RunSelfCheckAllSteps(const std::string& dir, const SelfOptions& options) {
  auto set = TraceSet::Load(dir, Loading(options));
  if (!set.ok()) return set.status();
  return SelfCheckAllSteps(*set, options);
}

}  // namespace gradtrace::diff
