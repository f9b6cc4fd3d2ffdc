#include "explain/reference_judge.h"

#include <utility>

#include "compare/align.h"
#include "compare/diff_engine.h"
#include "compare/side_compare.h"
#include "compare/tolerance.h"
#include "evidence/evidence.h"
#include "explain/self_judge.h"
#include "load/gather.h"

namespace gradtrace::diff {

Expected<ReferenceRun> ReferenceRun::Load(const std::string& dir) {
  auto set = TraceSet::Load(dir);
  if (!set.ok()) return set.status();
  ReferenceRun r;
  r.steps_ = StepsWithPhase(*set, pb::FINAL);
  if (r.steps_.empty()) return Status::InvalidArgument(dir + ": the reference holds no FINAL records");
  r.set_ = std::make_shared<const TraceSet>(std::move(*set));
  return r;
}

namespace {

// Parameters `ids` of `set`'s FINAL at `step`, their replicas read once.
Expected<std::vector<SideValues>> FinalOf(const TraceSet& set, int64_t step, const std::vector<int32_t>& ids) {
  Selection sel;
  sel.step = step;
  sel.phase = pb::FINAL;
  std::vector<SideValues> values;
  ReaderCache cache(0);
  GT_RETURN_IF_ERROR(GatherParams(set, SelectFrames(set, sel), ids, Combine::kReplicas, &cache, &values));
  return values;
}

}  // namespace

Expected<std::map<std::string, Moments>> FinalMoments(const TraceSet& set, int64_t step) {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < set.run().params_size(); ++id) ids.push_back(id);
  auto gathered = FinalOf(set, step, ids);
  if (!gathered.ok()) return gathered.status();
  const std::vector<SideValues>& values = *gathered;
  std::map<std::string, Moments> out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const SideSummary s = Summarize(values[i]);
    if (s.has_stats || s.complete()) {
      out[set.run().params(ids[i]).name()] = s.has_stats ? values[i].moments : MomentsOf(values[i]);
    }
  }
  return out;
}

Expected<Report> ReferenceRun::Judge(int64_t step, const pb::RunInfo& run, int world,
                                     const std::map<std::string, Moments>& mine, const Report* self,
                                     const TraceSet* steps) const {
  const TraceSet& ref = *set_;
  std::vector<int32_t> ids;
  std::vector<const pb::ParamInfo*> infos;
  for (int32_t id = 0; id < ref.run().params_size(); ++id) {
    if (mine.count(ref.run().params(id).name())) ids.push_back(id), infos.push_back(&ref.run().params(id));
  }
  auto gathered = FinalOf(ref, step, ids);
  if (!gathered.ok()) return gathered.status();
  const std::vector<SideValues>& values = *gathered;

  Report report;
  report.mode = "diff";
  report.phase = "final";
  report.step = step;
  report.a = SideOf(ref);
  report.b = SideOfRun(run, world);
  if (self != nullptr) report.b.reductions = EvidenceOfSelf(*self);
  if (steps != nullptr) {  // both sides' losses, as the diff reads them, when this run's are known
    StepLossAndTokens(ref, step, &report.a);
    StepLossAndTokens(*steps, step, &report.b);
  }
  report.tolerance = DefaultTolerance(ref.config(), run.config());
  const double rtol = report.tolerance.rtol;
  Verdict worst = Verdict::kMatch;
  for (size_t i = 0; i < ids.size(); ++i) {
    const SideValues& v = values[i];
    ParamResult p;
    p.name = infos[i]->name();
    p.numel = infos[i]->numel();
    p.param_kind = semantics::ParamKindName(infos[i]->kind());
    p.rtol = rtol;
    const SideSummary a = Summarize(v);
    if (!a.has_stats && !a.complete()) {
      p.verdict = Verdict::kMissing;
      p.note = "the reference's FINAL does not hold the whole parameter at this step";
    } else {
      p.metrics = CompareMoments(a.has_stats ? v.moments : MomentsOf(v), mine.at(p.name), a.stats_sums_only);
      p.verdict = Classify(p.metrics, rtol);
    }
    if (Severity(p.verdict) > Severity(worst)) worst = p.verdict;
    report.params.push_back(std::move(p));
  }
  report.groups = GroupParams(report.params, report.a, report.b, rtol);
  report.verdict = VerdictName(worst);
  report.summary =
      report.groups.empty() ? "no parameter in common with the reference" : report.groups.front().explanation;
  return report;
}

}  // namespace gradtrace::diff
