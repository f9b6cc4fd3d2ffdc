#include "compare/diff_engine.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <mutex>
#include <optional>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "compare/align.h"
#include "compare/side_compare.h"
#include "compare/stream_compare.h"
#include "compare/tolerance.h"
#include "compare/windowed_compare.h"
#include "compare/work_units.h"
#include "evidence/evidence.h"
#include "evidence/grad_norm.h"
#include "evidence/setup_check.h"
#include "expected_divisor.h"
#include "explain/explain.h"
#include "load/gather.h"
#include "load/progress.h"
#include "load/rename.h"
#include "load/thread_pool.h"
#include "slice_codec.h"

namespace gradtrace::diff {
namespace {

// The prefix of the note naming a set whose buckets accumulate across micro-steps.
constexpr char kAccumulationNote[] = "accumulating buckets in ";

Combine CombineFor(pb::Phase phase) { return phase == pb::PRE_REDUCE ? Combine::kSum : Combine::kReplicas; }

struct Compared {
  Metrics metrics;
  std::string note;
  bool computed = false;
  double replica_a = 0, replica_b = 0;  // relative disagreement between replicas
  int replica_rank_a = -1, replica_rank_b = -1, replica_first_a = -1, replica_first_b = -1;
};

// The compare phase's record of one parameter from its sides' summaries.
Compared MakeRecord(const Metrics& metrics, const std::string& note, const SideSummary& a, const SideSummary& b) {
  Compared c;
  c.metrics = metrics;
  c.note = note;
  c.computed = true;
  c.replica_a = a.replica_rel();
  c.replica_b = b.replica_rel();
  c.replica_rank_a = a.replica_other;
  c.replica_rank_b = b.replica_other;
  c.replica_first_a = a.replica_rank;
  c.replica_first_b = b.replica_rank;
  // Partial coverage (truncation) is missing data, not a comparison.
  if (a.only_partly_full() || b.only_partly_full()) {
    c.metrics.basis = Basis::kNone;
    c.note = !a.complete() ? Coverage("A", a) : Coverage("B", b);
  }
  return c;
}

// What every unit of one comparison reads: the two sets, the frames picked from each, the alignment.
struct Sources {
  const TraceSet& x;
  const TraceSet& y;
  std::vector<std::vector<const FrameRef*>> frames_x, frames_y;
  const Alignment& al;
  Combine combine;
};

// Parameters gathered whole (gather.h), all of them at once.
Status CompareWhole(const Sources& s, const std::vector<size_t>& pairs, ReaderCache* readers,
                    std::vector<Compared>* out) {
  std::vector<int32_t> ids_x, ids_y;
  for (size_t i : pairs) {
    ids_x.push_back(s.al.params[i].id_a);
    ids_y.push_back(s.al.params[i].id_b);
  }
  std::vector<SideValues> vx, vy;
  GT_RETURN_IF_ERROR(GatherParams(s.x, s.frames_x, ids_x, s.combine, readers, &vx));
  GT_RETURN_IF_ERROR(GatherParams(s.y, s.frames_y, ids_y, s.combine, readers, &vy));
  for (size_t k = 0; k < pairs.size(); ++k) {
    std::string note;
    const Metrics m = CompareSides(vx[k], vy[k], &note);
    (*out)[pairs[k]] = MakeRecord(m, note, Summarize(vx[k]), Summarize(vy[k]));
  }
  return Status::Ok();
}

// A parameter whose full slices the windows cannot follow is compared whole, as before windows, when its frames
// could hold it: a hostile numel with few slices is refused instead of allocated.
Status WholeFallback(const Sources& s, size_t pair, ReaderCache* readers, std::vector<Compared>* out) {
  const ParamPair& p = s.al.params[pair];
  uint64_t bytes = 0;
  for (const auto& [frames, id] : {std::pair{&s.frames_x, p.id_a}, std::pair{&s.frames_y, p.id_b}}) {
    for (const auto& per_rank : *frames) {
      for (const FrameRef* f : per_rank) {
        if (std::binary_search(f->param_ids.begin(), f->param_ids.end(), id)) bytes += f->raw_bytes;
      }
    }
  }
  if (static_cast<uint64_t>(p.numel) > bytes) {
    return Status::Corruption("parameter '" + p.name + "': full slices out of element order within a record, and its " +
                              std::to_string(p.numel) + " elements are more than its frames hold (" +
                              std::to_string(bytes) + " bytes): not reassembled");
  }
  return CompareWhole(s, {pair}, readers, out);
}

// One unit: streamed from the frames where the layout allows (stream: null never), else its parameters larger than
// `window` one at a time in windows, the others gathered whole together.
Status CompareUnit(const Sources& s, const Unit& unit, int64_t window, ReaderCache* readers, StreamCache* stream,
                   std::vector<Compared>* out) {
  if (stream != nullptr && s.combine == Combine::kReplicas) {
    std::vector<StreamedParam> r;
    if (CompareStreamed(s.x, s.y, s.frames_x, s.frames_y, s.al, unit.pairs, readers, stream, &r)) {
      for (size_t k = 0; k < r.size(); ++k) (*out)[unit.pairs[k]] = MakeRecord(r[k].metrics, "", r[k].a, r[k].b);
      return Status::Ok();
    }
  }
  std::vector<size_t> whole;
  for (size_t i : unit.pairs) {
    const ParamPair& p = s.al.params[i];
    if (window <= 0 || p.numel <= window) {
      whole.push_back(i);
      continue;
    }
    WindowedResult r;
    GT_RETURN_IF_ERROR(
        CompareWindowed(s.x, s.y, s.frames_x, s.frames_y, p.id_a, p.id_b, s.combine, window, readers, &r));
    if (r.whole) {
      GT_RETURN_IF_ERROR(WholeFallback(s, i, readers, out));
    } else {
      (*out)[i] = MakeRecord(r.metrics, r.note, r.a, r.b);
    }
  }
  return whole.empty() ? Status::Ok() : CompareWhole(s, whole, readers, out);
}

// Work that reads frames of its own, done by the comparison's threads beside its units (ParallelForBlocks
// weighs it with them) rather than by a thread of its own.
struct AlsoWork {
  int64_t weight = 0;  // as a unit's: elements compared
  std::function<void()> run;
};

// Gathers and compares every aligned parameter of `al` (y against x), a unit at a time on all threads, and
// runs `also` among the units.
Status CompareAll(const TraceSet& x, const TraceSet& y, const Alignment& al, const DiffOptions& options,
                  Progress* progress, std::vector<Compared>* out, const std::vector<AlsoWork>& also = {}) {
  Selection sel{al.step, al.phase};
  const Sources sources{x, y, SelectFrames(x, sel), SelectFrames(y, sel), al, CombineFor(al.phase)};
  std::vector<Unit> units = MakeUnits(al, sources.frames_x, sources.frames_y, options.unit_elements);
  int threads = ResolveThreads(options.threads);
  std::vector<ReaderCache> caches(threads);
  std::vector<StreamCache> streams(threads);
  out->assign(al.params.size(), Compared());
  std::mutex mu;
  Status first_error;
  std::atomic<size_t> done{0};
  // Neighbouring units share the frames at their cut: each thread takes a run of them (ParallelForBlocks) and
  // keeps those frames for the next (ReaderCache::Plan).
  std::vector<int> unit_x(x.run().params_size(), -1), unit_y(y.run().params_size(), -1);
  std::vector<int64_t> weight;
  for (size_t u = 0; u < units.size(); ++u) {
    int64_t elems = 0;
    for (size_t i : units[u].pairs) {
      const ParamPair& p = al.params[i];
      elems += p.numel;
      if (p.id_a >= 0 && p.id_a < static_cast<int32_t>(unit_x.size())) unit_x[p.id_a] = static_cast<int>(u);
      if (p.id_b >= 0 && p.id_b < static_cast<int32_t>(unit_y.size())) unit_y[p.id_b] = static_cast<int>(u);
    }
    weight.push_back(elems);
  }
  for (ReaderCache& cache : caches) {
    cache.Plan(x, unit_x);
    cache.Plan(y, unit_y);
  }
  for (StreamCache& cache : streams) {
    cache.Plan(x, unit_x);
    cache.Plan(y, unit_y);
  }
  for (const AlsoWork& w : also) weight.push_back(w.weight);
  ParallelForBlocks(weight, threads, [&](size_t u, int worker) {
    {
      std::lock_guard<std::mutex> lock(mu);
      if (!first_error.ok()) return;
    }
    if (u >= units.size()) {
      also[u - units.size()].run();
      return;
    }
    caches[worker].BeginUnit(u);
    streams[worker].BeginUnit(u);
    Status st = CompareUnit(sources, units[u], options.window_elements, &caches[worker],
                            options.stream ? &streams[worker] : nullptr, out);
    if (!st.ok()) {
      std::lock_guard<std::mutex> lock(mu);
      if (first_error.ok()) first_error = st;
      return;
    }
    if (progress) progress->Update(done.fetch_add(1) + 1, units.size());
  });
  if (progress) progress->Finish();
  return first_error;
}

double LogDistance(double s) { return std::isfinite(s) && s != 0 ? std::fabs(std::log(std::fabs(s))) : 1e300; }

void AddTruncations(const TraceSet& s, std::vector<std::string>* out) {
  for (const RankFile& f : s.ranks()) {
    if (f.truncated) {
      out->push_back(f.truncation + "; frames after offset " + std::to_string(f.stop_offset) + " are missing");
    }
  }
}

// What makes two diffs the same diff: the runs, their files' sizes, the
// options that change results, and the aligned parameters. Not the directory
// paths, so nodes that mount the traces at different places can share a merge.
std::string InputFingerprint(const TraceSet& a, const TraceSet& b, const TraceSet* noise, const DiffOptions& options,
                             const Alignment& al) {
  std::string text = "gradtrace-diff partial 1\n";
  for (const TraceSet* s : {&a, &b, noise}) {
    if (s == nullptr) continue;
    text += "set " + s->run().run_id() + " world " + std::to_string(s->world()) + " " + s->config().ShortDebugString() +
            "\n";
    for (const RankFile& f : s->ranks()) {
      text += std::filesystem::path(f.path).filename().string() + " " + std::to_string(f.file_size) + " " +
              std::to_string(f.truncated) + " " + std::to_string(f.stop_offset) + "\n";
    }
  }
  char rtol[40] = "none";
  if (options.rtol) std::snprintf(rtol, sizeof(rtol), "%.17g", *options.rtol);
  text += "step " + std::to_string(al.step) + " phase " + PhaseName(al.phase) + " rtol " + rtol + "\n";
  for (const auto& r : options.renames) text += "rename " + r + "\n";
  for (const ParamPair& p : al.params) text += p.name + " " + std::to_string(p.numel) + " " + p.problem + "\n";
  return Fingerprint(text);
}

// --noise: rel_error(A, A2) per parameter name, for the names in `part` only.
Status MeasureNoise(const TraceSet& a, const TraceSet& noise, const std::vector<RenameRule>& rules,
                    const DiffOptions& options, const Alignment& part,
                    std::unordered_map<std::string, double>* by_name) {
  auto noise_al = AlignSets(a, noise, rules, options.phase, part.step);
  if (!noise_al.ok()) return noise_al.status();
  std::unordered_set<std::string> names;
  for (const ParamPair& p : part.params) names.insert(p.name);
  std::erase_if(noise_al->params, [&](const ParamPair& p) { return !names.count(p.name); });
  std::vector<Compared> nc;
  GT_RETURN_IF_ERROR(CompareAll(a, noise, *noise_al, options, nullptr, &nc));
  for (size_t i = 0; i < nc.size(); ++i) {
    if (nc[i].computed && std::isfinite(nc[i].metrics.rel_error)) {
      (*by_name)[noise_al->params[i].name] = nc[i].metrics.rel_error;
    }
  }
  return Status();
}

ComparedParam MakeCompared(size_t index, const ParamPair& pp, const Compared& c, const TraceSet& a, const TraceSet& b) {
  ComparedParam p;
  p.index = index;
  p.name = pp.name;
  p.numel = pp.numel;
  p.shape = pp.shape;
  p.dtype = DTypeName(pp.dtype_b != pb::DTYPE_UNSPECIFIED ? pp.dtype_b : pp.dtype_a);
  p.problem = pp.problem;
  // The layout B recorded, else A's (1.0/1.1 traces record none).
  for (const auto& [set, id] : {std::pair{&b, pp.id_b}, std::pair{&a, pp.id_a}}) {
    if (id >= 0 && p.param_kind.empty()) p.param_kind = semantics::ParamKindName(set->run().params(id).kind());
  }
  if (pp.id_a >= 0) p.tied[0] = TiedCopiesWords(a.run().params(pp.id_a));
  if (pp.id_b >= 0) p.tied[1] = TiedCopiesWords(b.run().params(pp.id_b));
  if (!pp.problem.empty()) return p;
  p.metrics = c.metrics;
  p.note = c.note;
  p.replica[0] = {c.replica_a, c.replica_first_a, c.replica_rank_a, ""};
  p.replica[1] = {c.replica_b, c.replica_first_b, c.replica_rank_b, ""};
  for (int side = 0; side < 2; ++side) {
    ComparedParam::Replica& r = p.replica[side];
    if (r.rel > 0) r.other_path = (side == 0 ? a : b).ranks()[std::max(r.other, 0)].path;
  }
  return p;
}

// Tolerance: --rtol, else measured noise, else the dtype/summand bound. Per parameter.
// --baseline: each parameter's rtol times its cancellation (DiffOptions::rtol_scale), at most 0.05 (tolerance.h's
// cap); the largest is the report's.
std::vector<double> ScaledForTerms(const Comparison& c, Tolerance* tolerance, std::vector<double>* rtol) {
  const double base = tolerance->rtol;
  for (size_t i = 0; i < c.params.size(); ++i) {
    auto it = c.rtol_scale.find(c.params[i].name);
    if (it != c.rtol_scale.end()) (*rtol)[i] = std::min(0.05, base * std::max(1.0, it->second));
  }
  tolerance->rtol = *std::max_element(rtol->begin(), rtol->end());
  char buf[200];
  std::snprintf(
      buf, sizeof(buf),
      "rtol_p = min(0.05, %.3g x ||side_p|| / ||side_p - baseline_p||): the term's part is a difference of two "
      "runs; largest %.3g",
      base, tolerance->rtol);
  tolerance->bound = buf;
  tolerance->source = "baseline";
  return *rtol;
}

std::vector<double> JudgeTolerance(const Comparison& c, Tolerance* tolerance) {
  *tolerance = c.rtol ? FixedTolerance(*c.rtol) : DefaultTolerance(c.a.config, c.b.config);
  std::vector<double> rtol(c.params.size(), tolerance->rtol);
  if (!c.rtol_scale.empty() && !c.rtol) return ScaledForTerms(c, tolerance, &rtol);
  if (c.noise_dir.empty() || c.params.empty()) return rtol;
  double worst = 0;  // for parameters the noise run lacks
  for (const ComparedParam& p : c.params) {
    if (p.noise_rel_error) worst = std::max(worst, *p.noise_rel_error);
  }
  double u = std::max(UnitRoundoff(c.a.config.dtype()), UnitRoundoff(c.b.config.dtype()));
  for (size_t i = 0; i < c.params.size(); ++i) {
    rtol[i] = std::max(4 * c.params[i].noise_rel_error.value_or(worst), 4 * u);
  }
  tolerance->source = "noise";
  tolerance->rtol = *std::max_element(rtol.begin(), rtol.end());
  char buf[200];
  std::snprintf(buf, sizeof(buf), "rtol_p = max(4*rel_error(A, A2)_p, 4u) from %s; largest %.3g", c.noise_dir.c_str(),
                tolerance->rtol);
  tolerance->bound = buf;
  return rtol;
}

// Root mean square of every element compared in A (full and sketch bases):
// the magnitude the absolute floor scales with (tolerance.h).
double StepRms(const Comparison& c) {
  double sum_sq = 0;
  int64_t n = 0;
  for (const ComparedParam& p : c.params) {
    if (!p.problem.empty() || (p.metrics.basis != Basis::kFull && p.metrics.basis != Basis::kSketch)) continue;
    if (!std::isfinite(p.metrics.norm_a)) continue;
    sum_sq += p.metrics.norm_a * p.metrics.norm_a;
    n += p.metrics.compared;
  }
  return n > 0 ? std::sqrt(sum_sq / static_cast<double>(n)) : 0;
}

// One parameter's verdict; replicas that disagree beyond rtol become findings.
ParamResult JudgeParam(const ComparedParam& p, double rtol, double atol, std::vector<Finding>* findings,
                       bool* replica_problem) {
  ParamResult r;
  r.name = p.name;
  r.numel = p.numel;
  r.shape = p.shape;
  r.dtype = p.dtype;
  r.param_kind = p.param_kind;
  r.rtol = rtol;
  if (!p.problem.empty()) {
    r.verdict = Verdict::kMissing;
    r.note = p.problem;
    return r;
  }
  r.metrics = p.metrics;
  r.note = p.note;
  r.verdict = Classify(p.metrics, rtol, atol);
  if (r.verdict != Classify(p.metrics, rtol)) {
    r.zero = true;
    const double n = static_cast<double>(std::max<int64_t>(p.metrics.compared, 1));
    char buf[160];
    std::snprintf(buf, sizeof(buf), "zero up to rounding: RMS %.3g (A) and %.3g (B) against the absolute floor %.3g",
                  p.metrics.norm_a / std::sqrt(n), p.metrics.norm_b / std::sqrt(n), atol);
    r.note += (r.note.empty() ? "" : "; ") + std::string(buf);
  }
  for (int side = 0; side < 2; ++side) {
    const ComparedParam::Replica& rep = p.replica[side];
    if (rep.rel <= rtol) continue;
    *replica_problem = true;
    char buf[64];
    std::snprintf(buf, sizeof(buf), "%.3g", rep.rel);
    std::string msg = std::string(side == 0 ? "A" : "B") + ": replicas of '" + p.name + "' disagree (rank " +
                      std::to_string(rep.first) + " vs rank " + std::to_string(rep.other) + ", relative difference " +
                      buf + ", " + rep.other_path + ")" + p.tied[side];
    findings->push_back({"replica", msg});
    r.note += (r.note.empty() ? "" : "; ") + std::string("replicas disagree in ") + (side == 0 ? "A" : "B");
  }
  return r;
}

// Parameters zero up to rounding have no scale worth a group (their B/A is
// noise over noise): one note names them instead.
void NoteZeroParams(const std::vector<ParamResult>& params, double atol, std::vector<Finding>* findings) {
  std::string names;
  int count = 0;
  for (const ParamResult& p : params) {
    if (!p.zero) continue;
    if (++count <= 5) names += (count > 1 ? ", " : "") + p.name;
  }
  if (count == 0) return;
  if (count > 5) names += ", ...";
  char floor[32];
  std::snprintf(floor, sizeof floor, "%.3g", atol);
  findings->push_back({"note", std::to_string(count) + (count == 1 ? " parameter is" : " parameters are") +
                                   " zero up to rounding in both sets (RMS below the absolute floor " + floor +
                                   "): no scale is measured for " + (count == 1 ? "it" : "them") + " (" + names + ")"});
}

// Overall verdict (REPORT_SCHEMA.md): the worst parameter verdict by the one
// severity order (metrics.h Severity), with a truncated set "incomplete" above
// scaled and below missing.
std::string OverallVerdict(const Report& report, bool replica_problem) {
  Verdict worst = replica_problem ? Verdict::kMismatch : Verdict::kMatch;
  for (const ParamResult& p : report.params) {
    if (Severity(p.verdict) > Severity(worst)) worst = p.verdict;
  }
  if (Severity(worst) >= Severity(Verdict::kMissing)) return VerdictName(worst);
  if (report.a.truncated || report.b.truncated) return "incomplete";
  return VerdictName(worst);
}

// --phase pre/post add up a step's micro-steps; a set whose buckets accumulate
// across micro-steps (DDP under accumulation outside no_sync, bucket_view.h)
// holds the earlier micro-steps' reduced gradient in every later PRE/POST, so
// that sum is not its gradient: named in a note (and the summary).
void NoteAccumulation(int accumulating_params, const char* side, std::vector<std::string>* notes) {
  if (accumulating_params == 0) return;
  notes->push_back(std::string(kAccumulationNote) + side + " (" + std::to_string(accumulating_params) +
                   " parameters): each micro-step's PRE_REDUCE holds the previous micro-steps' reduced gradient "
                   "and FINAL is the last POST_REDUCE, so --phase pre/post (which add up the micro-steps) do not "
                   "measure this set; compare FINAL (--phase final)");
}

// A different start, or different data by the compared step, makes the
// gradients differ for a reason that is not a gradient bug: it becomes the
// verdict (exit 3). Otherwise (gradients match, or the data differ only later)
// it is a finding.
void ApplySetup(const Comparison& c, Report* report) {
  if (c.setup_verdict.empty()) return;
  const bool explains = c.setup_verdict == "different-start" || c.setup_data_step <= c.step;
  if (explains && report->verdict != "match") {
    report->findings.push_back({"setup", "gradients differ (" + report->summary + "), but " + c.setup_summary});
    report->verdict = c.setup_verdict;
    report->summary = c.setup_summary;
  } else {
    report->findings.push_back({"setup", c.setup_summary});
  }
}

Expected<std::vector<RenameRule>> ParseRenameRules(const std::vector<std::string>& texts) {
  std::vector<RenameRule> rules;
  for (const auto& text : texts) {
    auto r = ParseRenameRule(text);
    if (!r.ok()) return r.status();
    rules.push_back(std::move(*r));
  }
  return rules;
}

// Each side's reduction evidence the diff measures (explain.h tells a loss multiplier from a divisor with it).
// A sharded diff of FINAL measures each side's in one shard only, A's in shard 0 and B's in shard 1 % N, where the
// merge takes it from (merge.cc): repeated in every shard it was most of a shard's fixed cost
// (docs/dev/performance.md). PRE/POST diffs note accumulation from it in every shard, so they measure both.
struct SideEvidence {
  std::optional<EvidenceJob> a, b;
  std::vector<EvidenceJob*> jobs() {
    std::vector<EvidenceJob*> out;
    for (auto* j : {&a, &b}) {
      if (j->has_value()) out.push_back(&**j);
    }
    return out;
  }
};

bool SummedPhase(const Alignment& al) { return al.phase == pb::PRE_REDUCE || al.phase == pb::POST_REDUCE; }

SideEvidence PlanEvidence(const TraceSet& a, const TraceSet& b, const Alignment& al, const DiffOptions& options) {
  // Buckets that accumulate across micro-steps matter only to --phase pre/post.
  const bool summed = SummedPhase(al);
  const bool split = !summed && options.shard.n > 1;
  auto job = [&](const TraceSet& set) {
    EvidenceJob j;
    j.set = &set;
    j.step = al.step;
    j.count_accumulating = summed;
    return j;
  };
  SideEvidence e;
  if (!split || options.shard.k == 0) e.a = job(a);
  if (!split || options.shard.k == EvidenceShardB(options.shard.n)) e.b = job(b);
  return e;
}

// What the judge needs to know of each side besides its gradients at the compared step: who
// produced it, what its own reductions show (`evidence`, measured), its reported grad norm, loss and
// tokens, with the notes and truncations that go with them.
void DescribeSides(const TraceSet& a, const TraceSet& b, const Alignment& al, const DiffOptions& options,
                   SideEvidence&& evidence, Comparison* c) {
  c->a = SideOf(a);
  c->b = SideOf(b);
  c->a.reported_grad_norm = ReportedGradNorm(a, al.step);
  c->b.reported_grad_norm = ReportedGradNorm(b, al.step);
  if (evidence.a) c->a.reductions = std::move(evidence.a->reductions);
  if (evidence.b) c->b.reductions = std::move(evidence.b->reductions);
  if (options.bucket_view) {
    c->a.bucket_view = SideBucketView(a, al.step, options.rtol, options.threads);
    c->b.bucket_view = SideBucketView(b, al.step, options.rtol, options.threads);
  }
  StepLossAndTokens(a, al.step, &c->a);
  StepLossAndTokens(b, al.step, &c->b);
  c->notes = al.notes;
  for (const auto& [side, set] : {std::pair{"A", &a}, std::pair{"B", &b}}) {
    for (const std::string& n : set->inferences()) c->notes.push_back(std::string(side) + ": " + n);
  }
  if (SummedPhase(al)) {
    NoteAccumulation(evidence.a ? evidence.a->accumulating_params : 0, "A", &c->notes);
    NoteAccumulation(evidence.b ? evidence.b->accumulating_params : 0, "B", &c->notes);
  }
  AddTruncations(a, &c->truncations);
  AddTruncations(b, &c->truncations);
}

// This shard's share of `al`: the alignment of its pairs only, and their indexes in `al`. Compared
// pairs weigh their elements, the others nothing.
Alignment ShardShare(const Alignment& al, Shard shard, std::vector<size_t>* mine) {
  std::vector<int64_t> weights;
  for (const ParamPair& p : al.params) weights.push_back(p.problem.empty() ? p.numel : 0);
  *mine = ShardItems(weights, shard);
  Alignment part = al;
  part.params.clear();
  for (size_t i : *mine) part.params.push_back(al.params[i]);
  return part;
}

}  // namespace

Expected<Comparison> CompareSets(const TraceSet& a, const TraceSet& b, const DiffOptions& options,
                                 const TraceSet* noise) {
  auto rules = ParseRenameRules(options.renames);
  if (!rules.ok()) return rules.status();
  auto aligned = AlignSets(a, b, *rules, options.phase, options.step);
  if (!aligned.ok()) return aligned.status();
  const Alignment& al = *aligned;
  if (options.rtol) noise = nullptr;  // --rtol overrides the measured tolerance

  Comparison c, sides;
  // Each side's evidence is measured by the comparison's threads among its units: in a thread of its own, beside
  // the two workers on two cores, it slowed their first frames (the 1-rank bench diff 10 ms of wall, 14 ms of CPU
  // more: docs/dev/performance.md); measured first on every thread, it left a core idle for part of its time.
  SideEvidence evidence = PlanEvidence(a, b, al, options);
  std::vector<AlsoWork> also;
  for (EvidenceJob* j : evidence.jobs()) also.push_back({j->Weight(), [j] { j->Run(); }});
  c.step = al.step;
  c.phase = PhaseName(al.phase);
  c.rtol = options.rtol;
  c.rtol_scale = options.rtol_scale;
  if (noise != nullptr) c.noise_dir = noise->dir();
  c.param_count = al.params.size();
  c.shard = options.shard;
  c.fingerprint = InputFingerprint(a, b, noise, options, al);
  const SetupDifference setup = CheckSetup(a, b, al);
  c.setup_verdict = setup.verdict;
  c.setup_summary = setup.summary;
  c.setup_data_step = setup.first_data_step;

  std::vector<size_t> mine;
  const Alignment part = ShardShare(al, options.shard, &mine);
  uint64_t bytes = a.total_bytes() + b.total_bytes();
  Progress progress("gradtrace-diff: comparing", options.progress && Progress::Wanted(bytes));
  std::vector<Compared> compared;
  GT_RETURN_IF_ERROR(CompareAll(a, b, part, options, &progress, &compared, also));
  std::unordered_map<std::string, double> noise_by_name;
  if (noise != nullptr) GT_RETURN_IF_ERROR(MeasureNoise(a, *noise, *rules, options, part, &noise_by_name));
  DescribeSides(a, b, al, options, std::move(evidence), &sides);
  c.a = std::move(sides.a);
  c.b = std::move(sides.b);
  c.notes = std::move(sides.notes);
  c.truncations = std::move(sides.truncations);

  for (size_t j = 0; j < mine.size(); ++j) {
    ComparedParam p = MakeCompared(mine[j], part.params[j], compared[j], a, b);
    auto it = noise_by_name.find(p.name);
    if (it != noise_by_name.end()) p.noise_rel_error = it->second;
    c.params.push_back(std::move(p));
  }
  return c;
}

Expected<Report> JudgeComparison(const Comparison& c) {
  bool whole = c.params.size() == c.param_count;
  for (size_t i = 0; whole && i < c.params.size(); ++i) whole = c.params[i].index == i;
  if (!whole) {
    return Status::InvalidArgument("the comparison holds " + std::to_string(c.params.size()) + " of " +
                                   std::to_string(c.param_count) + " parameters (shard " + std::to_string(c.shard.k) +
                                   "/" + std::to_string(c.shard.n) + "): merge the parts before judging");
  }
  Report report;
  report.mode = "diff";
  report.a = c.a;
  report.b = c.b;
  report.step = c.step;
  report.phase = c.phase;
  for (const auto& n : c.notes) report.findings.push_back({"note", n});

  std::vector<double> rtol = JudgeTolerance(c, &report.tolerance);
  SetAbsoluteFloor(DefaultTolerance(c.a.config, c.b.config).rtol, StepRms(c), &report.tolerance);
  bool replica_problem = false;
  for (size_t i = 0; i < c.params.size(); ++i) {
    report.params.push_back(
        JudgeParam(c.params[i], rtol[i], report.tolerance.atol, &report.findings, &replica_problem));
  }
  for (const auto& t : c.truncations) report.findings.push_back({"truncated", t});
  NoteZeroParams(report.params, report.tolerance.atol, &report.findings);

  // Groups see the parameters in alignment order; the table shows the worst first.
  report.groups = GroupParams(report.params, c.a, c.b, report.tolerance.rtol);
  std::stable_sort(report.params.begin(), report.params.end(), [](const ParamResult& x, const ParamResult& y) {
    if (Severity(x.verdict) != Severity(y.verdict)) return Severity(x.verdict) > Severity(y.verdict);
    double rx = std::isnan(x.metrics.residual) ? -1 : x.metrics.residual;
    double ry = std::isnan(y.metrics.residual) ? -1 : y.metrics.residual;
    if (rx != ry) return rx > ry;
    return LogDistance(x.metrics.scale) > LogDistance(y.metrics.scale);
  });

  report.verdict = OverallVerdict(report, replica_problem);
  if (report.verdict == "match") {
    report.summary = "all " + std::to_string(report.params.size()) + " parameters match";
    if (!report.tolerance.precision.empty() && report.tolerance.source == "default") {
      report.summary +=
          " within " + report.tolerance.precision + " rounding (" + report.tolerance.precision_source + ")";
    }
  } else if (!report.groups.empty()) {
    report.summary = report.groups.front().explanation;  // the most serious finding (GroupParams' order)
  }
  // Summed micro-steps of an accumulating set are not its gradient: say so before any factor.
  for (const auto& n : c.notes) {
    if (n.rfind(kAccumulationNote, 0) == 0 && report.verdict != "match") report.summary = n + "; " + report.summary;
  }
  ApplySetup(c, &report);
  // A misreported norm is a finding of its own; with matching gradients it is the headline.
  report.grad_norm = CheckGradNorms(report);
  if (report.grad_norm && report.grad_norm->verdict == "misreported") {
    report.findings.push_back({"grad-norm", report.grad_norm->message});
    if (report.verdict == "match") report.summary = report.grad_norm->message;
  }
  return report;
}

Expected<Report> DiffSets(const TraceSet& a, const TraceSet& b, const DiffOptions& options, const TraceSet* noise) {
  auto c = CompareSets(a, b, options, noise);
  if (!c.ok()) return c.status();
  return JudgeComparison(*c);
}

Expected<LoadedSets> LoadSets(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options) {
  Progress reading("gradtrace-diff: reading", options.progress);
  // Bytes scanned and to scan per set (A, B, noise), the bar showing their sums.
  std::atomic<uint64_t> done[3] = {0, 0, 0}, total[3] = {0, 0, 0};
  auto load_options = [&](int which, int threads) {
    LoadOptions lo;
    lo.threads = threads;
    if (options.progress) {
      lo.progress = [&, which](uint64_t d, uint64_t n) {
        done[which] = d;
        total[which] = n;
        const uint64_t all = total[0] + total[1] + total[2];
        if (Progress::Wanted(all)) reading.Update(done[0] + done[1] + done[2], all);
      };
    }
    return lo;
  };
  // A's and B's catalogues at once where there are two threads or more: each is one thread's scan of an index per
  // rank file, so on one rank a core each instead of one after the other (the 1-rank bench pair: 0.7 ms each).
  const int threads = ResolveThreads(options.threads);
  std::optional<Expected<TraceSet>> a, b;
  if (threads > 1) {
    std::thread load_a([&] { a.emplace(TraceSet::Load(a_dir, load_options(0, threads - threads / 2))); });
    b.emplace(TraceSet::Load(b_dir, load_options(1, threads / 2)));
    load_a.join();
  } else {
    a.emplace(TraceSet::Load(a_dir, load_options(0, threads)));
    if (a->ok()) b.emplace(TraceSet::Load(b_dir, load_options(1, threads)));
  }
  if (!a->ok()) return a->status();  // A's error first, as when they were loaded one after the other
  if (!b->ok()) return b->status();
  LoadedSets sets{std::move(**a), std::move(**b), std::nullopt};
  if (!options.noise_dir.empty()) {
    auto n = TraceSet::Load(options.noise_dir, load_options(2, threads));
    if (!n.ok()) return n.status();
    sets.noise = std::move(*n);
  }
  reading.Finish();
  return sets;
}

Expected<Comparison> RunCompare(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options) {
  auto sets = LoadSets(a_dir, b_dir, options);
  if (!sets.ok()) return sets.status();
  return CompareSets(sets->a, sets->b, options, sets->noise ? &*sets->noise : nullptr);
}

Expected<Report> RunDiff(const std::string& a_dir, const std::string& b_dir, const DiffOptions& options) {
  auto c = RunCompare(a_dir, b_dir, options);
  if (!c.ok()) return c.status();
  return JudgeComparison(*c);
}

TraceSide SideOf(const TraceSet& s) {
  TraceSide t;
  t.dir = s.dir();
  t.producer = s.run().producer() + (s.run().producer_version().empty() ? "" : " " + s.run().producer_version());
  t.run_id = s.run().run_id();
  t.world = s.world();
  t.truncated = s.truncated();
  t.config = s.config();
  t.framework = s.run().framework();
  return t;
}

}  // namespace gradtrace::diff
