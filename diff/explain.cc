#include "explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>

#include "deepspeed_releases.h"
#include "degrees.h"
#include "expected_divisor.h"
#include "loss_recipes.h"
#include "predict.h"
#include "scaling_policy.h"

namespace gradtrace::diff {
namespace {

std::string Fixed(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f", v);
  return buf;
}

bool Near(double x, double want, double ctol) {
  return std::isfinite(x) && std::fabs(x - want) <= ctol * std::fabs(want);
}

pb::ParamKind KindOf(const std::string& name) {
  if (name == "expert") return pb::EXPERT;
  if (name == "tp-shard") return pb::TP_SHARD;
  if (name == "replicated") return pb::REPLICATED;
  return pb::DENSE;
}

// The DeepSpeed release a side models or ran ("" when none is known).
std::string DeepSpeedVersion(const TraceSide& s) {
  auto p = semantics::ResolvePolicy(s.config.scaling());
  if (p.ok() && !p->deepspeed_version.empty()) return p->deepspeed_version;
  return "";
}

// The split dimension's name: "sp", "cp", or "sp x cp".
std::string SplitName(const pb::Config& c) {
  const auto d = semantics::DegreesOf(c);
  if (d.cp > 1 && d.sp > 1) return "sp x cp";
  return d.cp > 1 ? "cp" : "sp";
}

// The degree of `c` (or its reciprocal) equal to `factor`, by the one degree list.
std::string DegreeEqualTo(double factor, const pb::Config& c, double ctol, const std::string& prefer = "") {
  if (!prefer.empty()) {
    for (const auto& d : semantics::ConfigDegrees()) {
      if (prefer == d.name && d.get(c) > 1 && (Near(factor, d.get(c), ctol) || Near(factor, 1 / d.get(c), ctol))) {
        return d.name;
      }
    }
  }
  for (const auto& d : semantics::ConfigDegrees()) {
    const double v = d.get(c);
    if (v > 1 && (Near(factor, v, ctol) || Near(factor, 1 / v, ctol))) return d.name;
  }
  return "";
}

std::string GroupWords(const std::string& kind) {
  if (kind == "expert") return "expert gradients";
  if (kind == "tp-shard") return "tensor-parallel shards";
  if (kind == "replicated") return "replicated parameters";
  return "";
}

// Whether the side's reductions of `kind` divide by exactly their group size.
bool IsPlainMean(const TraceSide& s, const std::string& kind, double ctol) {
  for (const auto& e : s.reductions) {
    if (e.param_kind == kind && e.group_size > 1 && e.Believed() > 0) return Near(e.Believed(), e.group_size, ctol);
  }
  return false;
}

// Words for a cause found on side `who` of configuration `cfg`.
std::string CauseWords(const Cause& k, const semantics::Prediction* p, const TraceSide& side, const std::string& kind,
                       double factor) {
  const pb::Config& cfg = side.config;
  const std::string who = k.side.empty() ? "B" : k.side;
  const bool ds = CitesDeepSpeed(side);
  const std::string version = DeepSpeedVersion(side);
  const bool up = factor > 1;
  if (k.cause == "none") return "B matches A";
  if (k.cause == "double-division" && k.dimension == "gas") {
    std::string s = who +
                    "'s gradients are divided by the gradient-accumulation steps twice more than the mean loss needs "
                    "(1/gas^2): a division by gas is applied in more than one place; divide by gas once";
    if (ds) s += " (as DeepSpeed 0.18.3's output hook did, issue #7749, fixed in 0.18.4)";
    return s;
  }
  if (k.cause == "double-division") {
    std::string s = who + " divides MoE buckets twice: ZeRO-1/2 divides the bucket by group size / sp (" +
                    Fixed(p ? std::sqrt(p->applied) : 0) + ") and again in allreduce_bucket, so " +
                    (kind == "expert" ? "expert" : "these") + " gradients are 1/dp of the mean-loss gradient";
    if (ds && (version.empty() || !semantics::HasPr4957(version))) s += " (DeepSpeed before PR #4957, fixed in 0.13.1)";
    return s;
  }
  if (k.cause == "loss-multiplier") {
    if (k.dimension == "gas") {
      return up ? who +
                      "'s loss is not divided by the gradient-accumulation steps (gas), so its micro-steps add up to "
                      "gas x the gradient; divide the loss by gas"
                : who + " divides by the accumulation steps twice (loss and gradient)";
    }
    if (k.dimension == "sp" || k.dimension == "cp" || k.dimension == "sp x cp") {
      if (!up) {
        return who + "'s loss divides by " + k.dimension + " once more than needed" +
               (IsPlainMean(side, kind, 1e-3) ? " (its reduction is the plain mean over its group, as DDP/FSDP do: "
                                                "scale the loss for that mean)"
                                              : "");
      }
      const std::string fix = semantics::SplitFix(cfg.loss(), k.dimension);
      if (cfg.loss() == "local-mean" || cfg.loss() == "alst-tutorial" || k.dimension == "sp") {
        std::string s = "the per-rank loss is a local mean and the reduction divides by dp only";
        if (ds && cfg.zero_stage() == 3) {
          s += " (DeepSpeed ZeRO-3 with reduce_scatter false, stage3.py all-reduce path)";
        } else if (ds && (version.empty() || semantics::HasPr4530(version))) {
          s += " (DeepSpeed ZeRO-1/2 since #4530)";
        } else if (!ds) {
          s = "the per-rank loss is a local mean over its sequence shard, so the " + k.dimension +
              " ranks' gradients add up to " + k.dimension + " x the sequence's, and the reduction divides by dp";
        }
        return s + "; use " + fix;
      }
      return who + "'s loss is multiplied by " + k.dimension + " (its " + k.dimension + " ranks' gradients add up to " +
             k.dimension + " x the sequence's) while its reduction divides as its layout needs; divide the loss by " +
             k.dimension + " or use a loss weighted by the whole sequence's valid tokens";
    }
    return who + "'s loss is multiplied by " + (k.dimension.empty() ? Fixed(factor) : k.dimension);
  }
  if (k.cause == "predivide") {
    return up ? who + " multiplies back the gradient_predivide_factor that was never divided out"
              : who + " pre-divides by gradient_predivide_factor and never multiplies back";
  }
  if (k.cause == "reduction-divisor") {
    const std::string group = GroupWords(kind);
    const std::string on = group.empty() ? "" : " on the " + group;
    if (kind == "expert" && k.dimension == "tp") {
      return up ? who +
                      "'s expert gradients are reduced over dp x tp ranks that hold tp copies of each expert, but "
                      "divided by dp only: they come out tp x the mean-loss gradient; divide by dp x tp or reduce "
                      "expert gradients over the expert-data-parallel ranks only"
                : who + " divides its expert gradients by tp although the tensor-parallel ranks do not share them";
    }
    if (kind == "mixed" && (k.dimension == "ep" || k.dimension == "edp")) {
      return up ? who +
                      " divides every gradient (dense and expert) by the expert-data-parallel size (dp / ep) "
                      "instead of dp: they come out ep x the mean-loss gradient; divide by dp"
                : who + " divides every gradient by ep once more than needed";
    }
    if (kind == "expert" && (k.dimension == "ep" || k.dimension == "edp" || k.dimension == "experts" || up)) {
      std::string s = who +
                      "'s expert gradients are averaged over the expert-data-parallel group (edp) instead of "
                      "the dense data-parallel ranks: they come out ep x the mean-loss gradient; divide expert "
                      "gradients by dp";
      if (ds) s += " (the mistake DeepSpeed PRs #5259/#6546 fixed)";
      return s;
    }
    if (k.dimension == "replicate") {
      return up ? who +
                      "'s gradients are reduce-scattered over the shard group and divided by its size only, then "
                      "all-reduced (summed) over the HSDP replicas: they come out replicate x the mean-loss gradient; "
                      "divide by shard x replicate (the data-parallel degree)"
                : who + " divides by the HSDP replicate degree once more than needed" + on;
    }
    if (k.dimension == "dp") {
      return up ? who + " sums the data-parallel ranks' gradients without dividing by dp" + on
                : who + " divides by dp once more than needed" + on;
    }
    if (k.dimension == "world") {
      return up ? who + " sums over all ranks without dividing (a 'sum' reduction)" + on
                : who + " divides by the world size once more than needed" + on;
    }
    if (k.dimension == "sp" || k.dimension == "cp") {
      if (up) return who + "'s reduction does not divide by " + k.dimension + on;
      if (cfg.loss() == "local-mean-div-sp") {
        return who + " divides by sp twice: the loss recipe divides by sp and the reduction averages over dp x sp";
      }
      return who + " divides by its " + (k.dimension == "sp" ? "sequence" : "context") +
             "-parallel degree once more than needed" + on;
    }
    if (k.dimension == "tp") {
      return up ? who + " sums the tensor-parallel ranks' identical gradients" + on
                : who + " divides by tp although the tensor-parallel ranks do not share these gradients" + on;
    }
    return who + "'s reduction divides by " + (up ? "less" : "more") + " than its layout needs" + on;
  }
  return "";
}

// Whether a modelled DeepSpeed release applies, on this path, the divisor the
// newest modelled release still applies: then that divisor is the framework's
// convention the loss must be written for (the recipe is what to change, as in
// hamishivi/tmax PR #9), not a reduction bug a later release fixed (PR #4530,
// #5555).
bool StillTheFrameworksDivisor(const pb::Config& cfg, pb::ParamKind kind, const semantics::Prediction& p, double ctol) {
  auto policy = semantics::ResolvePolicy(cfg.scaling());
  const auto& releases = semantics::DeepSpeedReleases();
  if (!policy.ok() || policy->deepspeed_version.empty() || releases.empty()) return false;
  pb::Config newest = cfg;
  newest.set_scaling("deepspeed@" + releases.back().version);
  const auto q = semantics::Predict(newest, kind);
  return q && q->applied > 0 && Near(p.applied, q->applied, ctol) && !p.double_division;
}

// The cause read from one side's prediction (that side's multiple != 1).
Cause CauseFromPrediction(const semantics::Prediction& p, const pb::Config& cfg, pb::ParamKind kind, double ctol) {
  Cause k;
  if (p.double_division && !Near(p.reduction_factor, 1, ctol)) {
    k.cause = "double-division";
    k.dimension = "dp";
  } else if (!Near(p.reduction_factor, 1, ctol)) {
    k.cause = StillTheFrameworksDivisor(cfg, kind, p, ctol) ? "loss-multiplier" : "reduction-divisor";
    k.dimension = DegreeEqualTo(p.reduction_factor, cfg, ctol, kind == pb::EXPERT ? "ep" : "");
  } else {
    k.cause = "loss-multiplier";
    const auto d = semantics::DegreesOf(cfg);
    if (Near(p.loss_factor, d.split(), ctol) && d.split() > 1) {
      k.dimension = SplitName(cfg);
    } else {
      k.dimension = DegreeEqualTo(p.loss_factor, cfg, ctol);
    }
  }
  return k;
}

// What a side's own reductions show for `kind`: the factor its believed divisor
// is off by (expected / believed), or empty when it measured nothing.
std::optional<double> ReductionOff(const TraceSide& s, const std::string& kind, double ctol) {
  for (const auto& e : s.reductions) {
    if (e.param_kind != kind || e.Believed() <= 0 || e.expected <= 0) continue;
    const double off = e.expected / e.Believed();
    return Near(off, 1, ctol) ? 1.0 : off;
  }
  return std::nullopt;
}

// The split dimension ("sp", "cp") a side's dense reductions leave out: their
// group is smaller than dp x sp x cp by that degree. "" when none.
std::string MissingGroupDimension(const TraceSide& s) {
  const auto d = semantics::DegreesOf(s.config);
  for (const auto& e : s.reductions) {
    if (e.param_kind != "dense" && !e.param_kind.empty()) continue;
    if (e.group_size <= 0) continue;
    const int full = d.dp * d.split();
    if (e.group_size >= full || full % e.group_size != 0) return "";
    const int left_out = full / e.group_size;
    if (d.sp > 1 && left_out == d.sp) return "sp";
    if (d.cp > 1 && left_out == d.cp) return "cp";
    return "";
  }
  return "";
}

// Whether the side's expert reductions run over a group of edp x tp ranks (tp copies of each expert).
bool ExpertGroupSpansTp(const TraceSide& s) {
  const int tp = semantics::DegreesOf(s.config).tp;
  for (const auto& e : s.reductions) {
    if (e.param_kind == "expert" && e.group_size > 0)
      return tp > 1 && semantics::ExpertCopies(s.config, e.group_size) == tp;
  }
  return false;
}

// The cause matched by candidates, using what the sides' reductions show.
Cause CauseFromCandidates(double scale, const std::string& kind, const TraceSide& a, const TraceSide& b, double ctol) {
  Cause k;
  auto matches = MatchFactor(scale, ScaleCandidates(a.config, b.config), ctol);
  if (matches.empty()) {
    k.cause = "unexplained";
    return k;
  }
  // Evidence: a side whose reduction divides as its layout needs carries a loss
  // multiplier, so prefer a loss dimension (sp, cp, gas) over dp/world.
  const auto off_b = ReductionOff(b, kind, ctol), off_a = ReductionOff(a, kind, ctol);
  const bool b_reduces_right = off_b && *off_b == 1.0;
  const bool a_reduces_right = off_a && *off_a == 1.0;
  const Candidate* best = &matches.front();
  auto loss_dim = [](const std::string& d) { return d == "sp" || d == "cp" || d == "gas"; };
  // Expert gradients over a group that spans tp copies of the same expert (TP + MoE): a reduction off by
  // tp names tp, not the dp it may equal.
  const TraceSide& owner = best->side == 'A' ? a : b;
  const std::optional<double> owner_off = best->side == 'A' ? off_a : off_b;
  if (kind == "expert" && owner_off && *owner_off != 1.0 && ExpertGroupSpansTp(owner)) {
    for (const auto& m : matches) {
      if (m.kind == "tp" && Near(m.value, *owner_off, ctol)) {
        best = &m;
        break;
      }
    }
  }
  for (const auto& m : matches) {
    if (best->kind == "tp" && kind == "expert") break;
    const bool right = m.side == 'A' ? a_reduces_right : b_reduces_right;
    if (right && loss_dim(m.kind)) {
      best = &m;
      break;
    }
    if (kind == "expert" && (m.kind == "ep" || m.kind == "edp")) {
      best = &m;
      break;
    }
  }
  k.expression = best->expr;
  if (best->squared) {
    k.cause = "double-division";
    k.side = best->side == 'A' ? "A" : "B";
    k.dimension = best->kind;
    return k;
  }
  if (best->kind == "one") {
    k.cause = "none";
    return k;
  }
  k.side = best->side == 'A' ? "A" : best->side == 'B' ? "B" : "";
  k.dimension = best->kind;
  const bool right = best->side == 'A' ? a_reduces_right : b_reduces_right;
  const std::optional<double> off = best->side == 'A' ? off_a : off_b;
  if (best->kind == "predivide") {
    k.cause = "predivide";
  } else if (kind == "expert" && (best->kind == "ep" || best->kind == "edp" || best->kind == "experts")) {
    k.cause = "reduction-divisor";
  } else if (right && loss_dim(best->kind)) {
    k.cause = "loss-multiplier";
  } else if (off && *off != 1.0) {
    // A reduction that is the plain mean over its group (what DDP, FSDP and a ZeRO reduce-scatter do) is the
    // convention a loss is written for: the loss scale is what is off, not the framework's mean.
    k.cause = IsPlainMean(best->side == 'A' ? a : b, kind, ctol) && kind != "expert" ? "loss-multiplier"
                                                                                     : "reduction-divisor";
  } else if (best->kind == "gas" || best->kind == "cp" || (best->kind == "sp" && !best->reciprocal)) {
    k.cause = "loss-multiplier";
  } else {
    k.cause = "reduction-divisor";
  }
  return k;
}

// Most serious first: the verdict severity of the worst member, then a factor
// away from 1, then size.
int GroupRank(const Group& g, const std::map<std::string, int>& severity) {
  int worst = 0;
  for (const auto& name : g.params) {
    auto it = severity.find(name);
    if (it != severity.end()) worst = std::max(worst, it->second);
  }
  return worst;
}

}  // namespace

bool CitesDeepSpeed(const TraceSide& s) {
  std::string producer = s.producer + " " + s.framework;
  std::transform(producer.begin(), producer.end(), producer.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (producer.find("deepspeed") != std::string::npos) return true;
  auto p = semantics::ResolvePolicy(s.config.scaling());
  return p.ok() && p->models_deepspeed;
}

std::vector<Candidate> ScaleCandidates(const pb::Config& a, const pb::Config& b) {
  std::vector<Candidate> out;
  out.push_back({"1", 1.0, "one", false, 'B', 0});
  for (const auto& atom : semantics::ConfigDegrees()) {
    double va = atom.get(a), vb = atom.get(b);
    std::string k = atom.name;
    if (vb > 1) {
      out.push_back({k + "(B)", vb, k, false, 'B', 1});
      out.push_back({"1/" + k + "(B)", 1 / vb, k, true, 'B', 2});
    }
    if (va > 1) {
      out.push_back({k + "(A)", va, k, false, 'A', 1});
      out.push_back({"1/" + k + "(A)", 1 / va, k, true, 'A', 2});
    }
    // A division by gas applied twice too often (DeepSpeed #7749); only that direction: a factor of
    // gas^2 upward is as likely gas x dp, which the candidates do not name.
    if (k == "gas" && vb > 1) out.push_back({"1/" + k + "(B)^2", 1 / (vb * vb), k, true, 'B', 3, true});
    if (va > 1 && vb > 1 && va != vb) {
      out.push_back({k + "(B)/" + k + "(A)", vb / va, k, false, 'R', 3});
      out.push_back({k + "(A)/" + k + "(B)", va / vb, k, true, 'R', 3});
    }
  }
  std::stable_sort(out.begin(), out.end(), [](const Candidate& x, const Candidate& y) {
    if (x.complexity != y.complexity) return x.complexity < y.complexity;
    if (x.side != y.side) return x.side == 'B';
    return semantics::DegreeRank(x.kind) < semantics::DegreeRank(y.kind);
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

double ClusterTolerance(double rtol) { return std::clamp(10 * rtol, 1e-6, 0.01); }

Cause ExplainCause(double scale, const std::string& param_kind, const TraceSide& a, const TraceSide& b, double ctol) {
  // The recorded layouts' prediction settles the cause when it equals the factor.
  const pb::ParamKind kind = KindOf(param_kind);
  const auto pa = semantics::Predict(a.config, kind), pb_ = semantics::Predict(b.config, kind);
  std::optional<double> predicted;
  if (pa && pb_ && pa->multiple > 0) predicted = pb_->multiple / pa->multiple;
  Cause k;
  const semantics::Prediction* used = nullptr;
  const TraceSide* side = &b;
  if (predicted && Near(scale, *predicted, ctol) && !Near(scale, 1, ctol)) {
    const bool b_off = !Near(pb_->multiple, 1, ctol);
    const bool a_off = !Near(pa->multiple, 1, ctol);
    used = b_off ? &*pb_ : &*pa;
    side = b_off ? &b : &a;
    k = CauseFromPrediction(*used, side->config, kind, ctol);
    k.side = b_off && a_off ? "" : b_off ? "B" : "A";
    auto matches = MatchFactor(scale, ScaleCandidates(a.config, b.config), ctol);
    for (const auto& m : matches) {
      if (m.kind == k.dimension || (k.dimension == "sp x cp" && m.kind == "sp")) {
        k.expression = m.expr;
        break;
      }
    }
    if (k.expression.empty() && !matches.empty()) k.expression = matches.front().expr;
  } else {
    k = CauseFromCandidates(scale, param_kind, a, b, ctol);
    side = k.side == "A" ? &a : &b;
  }
  k.predicted = predicted;
  // A factor of an A-side atom means A carries the error (B/A = 1/x(A)): words in A's direction.
  const double own = k.side == "A" ? 1 / scale : scale;
  if (k.cause == "unexplained") {
    k.why =
        "matches no expression of the two configurations (sp, cp, dp, tp, replicate, world, gas, gas^2, "
        "predivide factor, ep, edp, experts)";
  } else {
    k.why = CauseWords(k, used, *side, param_kind, own);
  }
  if (predicted && !Near(scale, *predicted, ctol)) k.why += "; the configurations predict B/A = " + Fixed(*predicted);
  // The recorded losses confirm a loss multiplier when their ratio is the factor (they never refute one:
  // a producer's loss values may be scaled for logging).
  if (k.cause == "loss-multiplier" && a.loss_per_replica > 0 && b.loss_per_replica > 0) {
    const double ratio = b.loss_per_replica / a.loss_per_replica;
    if (std::fabs(ratio - scale) <= 1e-3 * scale) {
      k.why += "; the recorded losses agree (B's loss per data-parallel replica is " + Fixed(ratio) + " x A's)";
    }
  }
  return k;
}

std::string ExplainScale(double scale, int count, int total, const std::string& param_kind, const TraceSide& a,
                         const TraceSide& b, double ctol, Cause* cause) {
  std::string which = count == total ? "for all " + std::to_string(total) + " parameters"
                                     : "for " + std::to_string(count) + " of " + std::to_string(total) + " parameters";
  if (count == 1 && total == 1) which = "for the only parameter";
  const std::string group = GroupWords(param_kind);
  if (!group.empty() && count != total) which += " (" + group + ")";
  Cause k = ExplainCause(scale, param_kind, a, b, ctol);
  std::string s =
      "B/A = " + Fixed(scale) + (k.expression.empty() ? "" : " = " + k.expression) + " " + which + ": " + k.why;
  if (cause) *cause = std::move(k);
  return s;
}

std::vector<Group> GroupParams(const std::vector<ParamResult>& params, const TraceSide& a, const TraceSide& b,
                               double rtol) {
  std::vector<Group> groups;
  double ctol = ClusterTolerance(rtol);
  int total = static_cast<int>(params.size());
  std::map<std::string, int> severity;
  for (const auto& p : params) severity[p.name] = Severity(p.verdict);
  std::vector<const ParamResult*> scalable;
  for (const auto& p : params) {
    if ((p.verdict == Verdict::kMatch || p.verdict == Verdict::kScaled) && std::isfinite(p.metrics.scale) && !p.zero) {
      scalable.push_back(&p);
    }
  }
  std::sort(scalable.begin(), scalable.end(),
            [](const ParamResult* x, const ParamResult* y) { return x->metrics.scale < y->metrics.scale; });
  for (size_t i = 0; i < scalable.size();) {
    double first = scalable[i]->metrics.scale;
    size_t j = i;
    while (j < scalable.size() && std::fabs(scalable[j]->metrics.scale - first) <= ctol * std::fabs(first)) ++j;
    Group g;
    g.kind = "scale";
    g.scale = scalable[(i + j) / 2]->metrics.scale;  // median
    g.count = static_cast<int>(j - i);
    std::set<std::string> kinds;
    for (size_t k = i; k < j; ++k) {
      g.params.push_back(scalable[k]->name);
      kinds.insert(scalable[k]->param_kind);
    }
    g.param_kind = kinds.size() == 1 ? *kinds.begin() : "mixed";
    // A group holding experts is explained as experts (a MoE bucket divides all it holds).
    // Without a modelled policy a group of experts and dense parameters is one reduction of everything ("mixed").
    const bool modelled = semantics::Predict(b.config, pb::EXPERT).has_value();
    const std::string explain_kind = kinds.count("expert") ? (kinds.size() > 1 && !modelled ? "mixed" : "expert")
                                     : kinds.size() == 1   ? *kinds.begin()
                                                           : "dense";
    Cause k;
    g.explanation = ExplainScale(*g.scale, g.count, total, explain_kind, a, b, ctol, &k);
    g.expression = k.expression;
    g.cause = k.cause;
    g.dimension = k.dimension == "sp x cp" ? "sp" : k.dimension;
    g.side = k.side;
    g.predicted = k.predicted;
    groups.push_back(std::move(g));
    i = j;
  }
  for (Verdict v : {Verdict::kMismatch, Verdict::kMissing, Verdict::kNonfinite}) {
    Group g;
    g.kind = VerdictName(v);
    std::set<std::string> kinds;
    for (const auto& p : params) {
      if (p.verdict == v) g.params.push_back(p.name), kinds.insert(p.param_kind);
    }
    g.count = static_cast<int>(g.params.size());
    if (g.count == 0) continue;
    g.param_kind = kinds.size() == 1 ? *kinds.begin() : "mixed";
    std::string n = std::to_string(g.count) + (g.count == 1 ? " parameter" : " parameters");
    const char* are = g.count == 1 ? " is" : " are";
    if (v == Verdict::kMismatch) {
      g.explanation = n + " of B" + are + " not a multiple of A (residual above tolerance)";
      g.cause = "unexplained";
      // Lossy compression (PowerSGD's low-rank approximation) makes gradients approximations, not multiples.
      for (const TraceSide* s : {&b, &a}) {
        const std::string& hook = s->config.comm_hook();
        if (hook.find("powerSGD") == std::string::npos && hook.find("PowerSGD") == std::string::npos) continue;
        g.cause = "lossy-compression";
        g.side = s == &b ? "B" : "A";
        g.explanation += "; " + g.side + " communicates through " + hook +
                         ", a lossy low-rank compression (with error feedback): its gradients approximate the "
                         "exact ones, so they are not a multiple of them; compare against a run without it to "
                         "measure the approximation, not a scaling bug";
        break;
      }
      // A reduction group that leaves out a split dimension: those ranks keep their own partial gradients.
      for (const TraceSide* s : {&b, &a}) {
        if (g.cause != "unexplained") break;
        const std::string missing = MissingGroupDimension(*s);
        if (missing.empty()) continue;
        g.cause = "incomplete-group";
        g.side = s == &b ? "B" : "A";
        g.dimension = missing;
        g.explanation += "; " + g.side + "'s dense gradients are reduced over a group that leaves out its " + missing +
                         " ranks, so each " + missing +
                         " rank keeps its own partial gradient (the replicas disagree); reduce over dp x " + missing;
        break;
      }
      // What the deviation follows, when the traces can tell: unequal valid-token counts per micro-batch/shard.
      for (const TraceSide* s : {&b, &a}) {
        if (g.cause != "unexplained") break;
        if (s->valid_tokens_min > 0 && s->valid_tokens_max > s->valid_tokens_min) {
          g.cause = "token-normalisation";
          g.side = s == &b ? "B" : "A";
          g.dimension = s->config.gas() > 1 ? "gas" : semantics::DegreesOf(s->config).split() > 1 ? "sp" : "dp";
          g.explanation += "; " + g.side + "'s valid-token counts differ across its " +
                           (g.dimension == "gas" ? "gas micro-batches" : g.dimension + " shards") + " (" +
                           std::to_string(s->valid_tokens_min) + " to " + std::to_string(s->valid_tokens_max) +
                           "): the loss is likely normalised per micro-batch/shard, not by the total valid tokens "
                           "(weight each micro-batch's token-loss sum by the total valid tokens)";
          break;
        }
      }
    }
    if (v == Verdict::kMissing) g.explanation = n + " could not be compared (absent, shape differs, or incomplete)";
    if (v == Verdict::kNonfinite) g.explanation = n + " hold NaN or Inf";
    groups.push_back(std::move(g));
  }
  std::stable_sort(groups.begin(), groups.end(), [&](const Group& x, const Group& y) {
    const int rx = GroupRank(x, severity), ry = GroupRank(y, severity);
    if (rx != ry) return rx > ry;
    return x.count > y.count;
  });
  return groups;
}

}  // namespace gradtrace::diff
