#include "explain/self_judge.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "cause.h"
#include "compare/tolerance.h"
#include "divisor_finding.h"
#include "evidence/bucket_view.h"
#include "evidence/grad_norm.h"
#include "expected_divisor.h"
#include "explain/divisor_words.h"
#include "explain/explain.h"
#include "explain/step_words.h"

namespace gradtrace::diff {

void ReductionSums::Merge(const ReductionSums& o) {
  ss += o.ss;
  sp += o.sp;
  pp += o.pp;
  compared += o.compared;
  sum_sq += o.sum_sq;
  members_sq += o.members_sq;
  buckets.insert(o.buckets.begin(), o.buckets.end());
  if (group.empty()) group = o.group;
  group_size = std::max(group_size, o.group_size);
  if (declared == 0) declared = o.declared;
  problems.insert(problems.end(), o.problems.begin(), o.problems.end());
}

bool IdenticalInputs(double sum_sq, double members_sq, double rtol) {
  return members_sq > 0 && std::isfinite(sum_sq) && std::isfinite(members_sq) &&
         std::fabs(1 - sum_sq / members_sq) <= rtol * rtol;
}

namespace {

// One parameter's effective divisor and verdict (tolerance.h: rtol with the absolute floor).
SelfParam JudgeSelfParam(const pb::ParamInfo& info, const ReductionSums& acc, const pb::Config& config, double rtol,
                         double ctol, double atol, std::vector<Finding>* findings) {
  SelfParam p;
  p.name = info.name();
  p.numel = info.numel();
  p.group = acc.group;
  p.group_size = acc.group_size;
  p.buckets.assign(acc.buckets.begin(), acc.buckets.end());
  p.compared = acc.compared;
  p.declared = acc.declared;
  p.param_kind = semantics::ParamKindName(info.kind());
  p.model_parallel = semantics::ModelParallelReduction(info, p.group);
  p.identical_inputs = p.model_parallel && IdenticalInputs(acc.sum_sq, acc.members_sq, rtol);
  p.expected =
      p.group_size > 0 ? semantics::ExpectedDivisorOver(config, info, {p.group, p.group_size, p.identical_inputs}) : 0;
  const double n = static_cast<double>(acc.compared);
  if (acc.compared == 0 || acc.sp == 0) {
    p.divisor = std::nan("");
    p.residual = std::nan("");
    p.verdict = SelfVerdict::kMissing;
  } else if (!std::isfinite(acc.ss) || !std::isfinite(acc.sp) || !std::isfinite(acc.pp)) {
    // NaN or Inf among the values compared: no divisor to measure (a NaN used to pass every test below as ok).
    p.divisor = std::nan("");
    p.residual = std::nan("");
    p.verdict = SelfVerdict::kMissing;
    findings->push_back(
        {"divisor", "'" + p.name + "': NaN or Inf among its reduction's values: no divisor is measured"});
  } else if (std::sqrt(acc.pp / n) <= atol && std::sqrt(acc.ss / n) <= atol) {
    // Zero up to rounding on both sides: no divisor to measure, nothing wrong.
    p.divisor = std::nan("");
    p.residual = 0;
    p.verdict = SelfVerdict::kOk;
  } else {
    p.divisor = acc.ss / acc.sp;
    double res2 = std::max(0.0, acc.pp - acc.sp * acc.sp / acc.ss);
    p.residual = acc.pp > 0 ? std::sqrt(res2 / acc.pp) : 0;
    // Relative to ||POST||, with the absolute floor's share (tolerance.h).
    const double allowed = std::max(rtol, 1e-6) + (acc.pp > 0 ? atol * std::sqrt(n / acc.pp) : 0);
    if (p.residual > allowed) {
      p.verdict = SelfVerdict::kInconsistent;
    } else if (p.expected > 0 && std::fabs(p.divisor - p.expected) > ctol * p.expected) {
      p.verdict = SelfVerdict::kWrongDivisor;
    } else {
      p.verdict = SelfVerdict::kOk;
    }
    if (p.declared > 0 && std::fabs(p.declared - p.divisor) > ctol * std::fabs(p.divisor)) {
      findings->push_back({"divisor", "'" + p.name + "': producer declared divisor " + FormatFixed(p.declared) +
                                          " but the effective divisor is " + FormatFixed(p.divisor)});
    }
  }
  for (const auto& pr : acc.problems) findings->push_back({"divisor", "'" + p.name + "': " + pr});
  if (!acc.problems.empty() && p.verdict == SelfVerdict::kOk) p.verdict = SelfVerdict::kMissing;
  return p;
}

// The group of parameters whose reductions are not a multiple of their inputs: no divisor is claimed.
void NameInconsistent(const pb::Config& config, Group* g) {
  g->kind = "inconsistent";
  g->count = static_cast<int>(g->params.size());
  const semantics::Cause cause = semantics::InconsistentReductionCause(config);
  g->cause = cause;
  g->explanation = std::to_string(g->count) + (g->count == 1 ? " parameter" : " parameters") +
                   ": POST_REDUCE is not a multiple of the sum of PRE_REDUCE over the group, or the replicas of FINAL "
                   "disagree (residual above tolerance): no divisor is claimed";
  if (cause == semantics::Cause::kLossyCompression) {
    g->explanation += FillSentence(
        "; the run communicates through {hook}, a lossy low-rank compression: its reductions approximate the sum",
        {{"hook", config.comm_hook()}});
  }
}

// Parameters with the same effective divisor over groups of the same size, largest group first.
void GroupDivisors(const pb::Config& config, bool deepspeed, double ctol, Report* report) {
  std::vector<const SelfParam*> ok;
  Group inconsistent;
  std::set<std::string> names, inconsistent_names;  // a parameter has an entry per group it was reduced over
  for (const auto& p : report->self_params) {
    names.insert(p.name);
    // A reduction that is not a division of the sum has no divisor to claim.
    if (p.verdict == SelfVerdict::kInconsistent) {
      if (inconsistent_names.insert(p.name).second) inconsistent.params.push_back(p.name);
    } else if (std::isfinite(p.divisor)) {
      ok.push_back(&p);
    }
  }
  // Each group with the worst verdict of its entries.
  std::vector<std::pair<Group, SelfVerdict>> groups;
  if (!inconsistent.params.empty()) {
    NameInconsistent(config, &inconsistent);
    groups.emplace_back(std::move(inconsistent), SelfVerdict::kInconsistent);
  }
  // Clusters hold one kind over one group: sort by those first.
  std::sort(ok.begin(), ok.end(), [](const SelfParam* x, const SelfParam* y) {
    return std::tie(x->param_kind, x->group_size, x->group, x->divisor) <
           std::tie(y->param_kind, y->group_size, y->group, y->divisor);
  });
  int n = static_cast<int>(names.size());
  for (size_t i = 0; i < ok.size();) {
    // j > i always: a negative divisor (POST of the opposite sign) used to make the width negative and loop forever.
    size_t j = i + 1;
    while (j < ok.size() && std::fabs(ok[j]->divisor - ok[i]->divisor) <= ctol * std::fabs(ok[i]->divisor) &&
           ok[j]->group_size == ok[i]->group_size && ok[j]->group == ok[i]->group &&
           ok[j]->param_kind == ok[i]->param_kind)
      ++j;
    Group g;
    g.kind = "divisor";
    const SelfParam& mid = *ok[(i + j) / 2];
    g.scale = mid.divisor;
    g.count = static_cast<int>(j - i);
    SelfVerdict worst = SelfVerdict::kOk;
    for (size_t k = i; k < j; ++k) g.params.push_back(ok[k]->name), worst = std::max(worst, ok[k]->verdict);
    g.explanation = ExplainDivisor(*g.scale, g.count, n, mid, config, deepspeed, ctol, &g);
    groups.emplace_back(std::move(g), worst);
    i = j;
  }
  // Most serious first (the worst member verdict), then largest.
  std::stable_sort(groups.begin(), groups.end(), [](const auto& x, const auto& y) {
    if (x.second != y.second) return x.second > y.second;
    return x.first.count > y.first.count;
  });
  for (auto& entry : groups) report->groups.push_back(std::move(entry.first));
}

// own when no reduction of it was recorded), with a finding.
void MarkDisagreeingReplicas(const pb::RunInfo& run, const std::map<int32_t, ReplicaDisagreement>& bad,
                             Report* report) {
  for (const auto& [id, d] : bad) {
    if (id < 0 || id >= run.params_size()) continue;
    const pb::ParamInfo& info = run.params(id);
    bool listed = false;  // every entry of the parameter (one per group it was reduced over)
    for (SelfParam& p : report->self_params) {
      if (p.name == info.name()) p.verdict = SelfVerdict::kInconsistent, listed = true;
    }
    if (!listed) {
      SelfParam p;
      p.name = info.name();
      p.numel = info.numel();
      p.param_kind = semantics::ParamKindName(info.kind());
      p.divisor = std::nan("");
      p.residual = d.rel;
      p.verdict = SelfVerdict::kInconsistent;
      report->self_params.push_back(std::move(p));
    }
    const std::string tied = TiedCopiesWords(info);  // "" unless two pipeline stages hold copies
    report->findings.push_back(
        {"replica", "replicas of '" + info.name() + "' disagree in FINAL (rank " + std::to_string(d.rank) +
                        " vs rank " + std::to_string(d.other) + ", relative difference " + FormatNumber(d.rel, 3) +
                        ")" +
                        (tied.empty() ? ": its gradient was not reduced over every rank that holds it (e.g. a norm "
                                        "or bias replicated under tensor/sequence parallelism, not all-reduced over tp)"
                                      : tied)});
  }
}

// The worst parameter verdict, then incomplete for a truncated set, else ok.
std::string SelfOverallVerdict(const Report& report, bool truncated) {
  SelfVerdict worst = SelfVerdict::kOk;
  for (const SelfParam& p : report.self_params) worst = std::max(worst, p.verdict);
  if (worst != SelfVerdict::kOk) return SelfVerdictName(worst);
  return truncated ? "incomplete" : "ok";
}

}  // namespace

const char* SelfVerdictName(SelfVerdict v) {
  switch (v) {
    case SelfVerdict::kOk:
      return "ok";
    case SelfVerdict::kMissing:
      return "missing";
    case SelfVerdict::kWrongDivisor:
      return "wrong-divisor";
    case SelfVerdict::kInconsistent:
      return "inconsistent";
  }
  return "?";
}
TraceSide SideOfRun(const pb::RunInfo& run, int world) {
  TraceSide side;
  side.producer = run.producer() + (run.producer_version().empty() ? "" : " " + run.producer_version());
  side.run_id = run.run_id();
  side.world = world;
  side.config = run.config();
  side.framework = run.framework();
  return side;
}

Report SelfReportHead(const pb::RunInfo& run, int world, std::optional<double> rtol) {
  Report report;
  report.mode = "self";
  report.phase = "post";
  report.a = SideOfRun(run, world);
  report.tolerance = rtol ? FixedTolerance(*rtol) : DefaultTolerance(run.config(), run.config());
  return report;
}

void JudgeSelf(const pb::RunInfo& run, const SelfMeasurements& m, Report* report) {
  const pb::Config& config = run.config();
  const double rtol = report->tolerance.rtol;
  // The absolute floor (tolerance.h) from the RMS of every POST value compared.
  double post_sq = 0;
  int64_t post_n = 0;
  for (const auto& [key, acc] : m.reductions) post_sq += acc.pp, post_n += acc.compared;
  SetAbsoluteFloor(DefaultTolerance(config, config).rtol,
                   post_n > 0 ? std::sqrt(post_sq / static_cast<double>(post_n)) : 0, &report->tolerance);
  report->accumulating_params = static_cast<int>(m.accumulating.size());
  for (const auto& [key, acc] : m.reductions) {
    if (key.first < 0 || key.first >= run.params_size()) continue;
    report->self_params.push_back(JudgeSelfParam(run.params(key.first), acc, config, rtol, ClusterTolerance(rtol),
                                                 report->tolerance.atol, &report->findings));
    report->self_params.back().accumulates = m.accumulating.count(key.first) > 0;
  }
  std::map<int32_t, ReplicaDisagreement> disagreeing;  // beyond rtol (the guard hands every difference over)
  for (const auto& [id, d] : m.replicas) {
    if (!(d.rel <= rtol)) disagreeing[id] = d;
  }
  MarkDisagreeingReplicas(run, disagreeing, report);
  for (const NonfiniteRecord& r : m.nonfinite) report->findings.push_back({"nonfinite", NonfiniteWords(run, r)});
  if (!m.skipped.empty()) report->findings.push_back({"skipped", SkippedStepWords(m.skipped, report->step)});
  for (const auto& [kind, message] : m.notes) report->findings.push_back({kind, message});
  GroupDivisors(config, CitesDeepSpeed(report->a), ClusterTolerance(rtol), report);
  std::stable_sort(report->self_params.begin(), report->self_params.end(),
                   [](const SelfParam& x, const SelfParam& y) { return x.verdict > y.verdict; });
  report->verdict = SelfOverallVerdict(*report, m.truncated);
  report->summary = !report->groups.empty() ? report->groups.front().explanation
                    : m.final_only          ? "the replicas of every parameter agree in FINAL (no reductions recorded)"
                                            : "no reductions to check";
  const std::string accumulation = AccumulationFinding(report->bucket_view);
  if (!accumulation.empty()) report->findings.push_back({"accumulation", accumulation});
  AddSelfGradNorm(m.reported_norm, m.final_norm, report);
}

}  // namespace gradtrace::diff
