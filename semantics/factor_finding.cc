#include "factor_finding.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "candidates.h"
#include "degrees.h"
#include "expected_divisor.h"
#include "loss_recipes.h"
#include "predict.h"
#include "scaling_policy.h"

namespace gradtrace::semantics {
namespace {

bool Near(double x, double want, double ctol) { return NearFactor(x, want, ctol); }

pb::ParamKind KindOf(const std::string& name) {
  if (name == "expert") return pb::EXPERT;
  if (name == "tp-shard") return pb::TP_SHARD;
  if (name == "replicated") return pb::REPLICATED;
  return pb::DENSE;
}

// The DeepSpeed release a side models or ran ("" when none is known).
std::string DeepSpeedVersion(const pb::Config& c) {
  auto p = ResolvePolicy(c.scaling());
  return p.ok() ? p->deepspeed_version : "";
}

// The split dimension: sp, cp, or both.
Dimension SplitOf(const pb::Config& c) {
  const auto d = DegreesOf(c);
  if (d.cp > 1 && d.sp > 1) return Dimension::kSpCp;
  return d.cp > 1 ? Dimension::kCp : Dimension::kSp;
}

// The degree of `c` (or its reciprocal) equal to `factor`, by the one degree list; `prefer` first.
Dimension DegreeEqualTo(double factor, const pb::Config& c, double ctol, Dimension prefer = Dimension::kNone) {
  if (prefer != Dimension::kNone) {
    for (const auto& d : ConfigDegrees()) {
      if (prefer == d.dim && d.get(c) > 1 && (Near(factor, d.get(c), ctol) || Near(factor, 1 / d.get(c), ctol))) {
        return d.dim;
      }
    }
  }
  for (const auto& d : ConfigDegrees()) {
    const double v = d.get(c);
    if (v > 1 && (Near(factor, v, ctol) || Near(factor, 1 / v, ctol))) return d.dim;
  }
  return Dimension::kNone;
}

// Whether the side's reductions of `kind` divide by exactly their group size, the convention a loss is
// written for; not for a loss weighted by the global batch's tokens, whose reductions must sum.
bool IsPlainMean(const SideFacts& s, const std::string& kind, double ctol) {
  if (RanksSumToGlobalLoss(s.config.loss())) return false;
  for (const auto& e : s.reductions) {
    if (e.param_kind == kind && e.group_size > 1 && e.believed > 0) return Near(e.believed, e.group_size, ctol);
  }
  return false;
}

// Whether a modelled DeepSpeed release applies, on this path, the divisor the
// newest modelled release still applies: then that divisor is the framework's
// convention the loss must be written for (the recipe is what to change, as in
// hamishivi/tmax PR #9), not a reduction bug a later release fixed (PR #4530,
// #5555).
bool StillTheFrameworksDivisor(const pb::Config& cfg, pb::ParamKind kind, const Prediction& p, double ctol) {
  auto policy = ResolvePolicy(cfg.scaling());
  const auto& releases = DeepSpeedReleases();
  if (!policy.ok() || policy->deepspeed_version.empty() || releases.empty()) return false;
  pb::Config newest = cfg;
  newest.set_scaling("deepspeed@" + releases.back().version);
  const auto q = Predict(newest, kind);
  return q && q->applied > 0 && Near(p.applied, q->applied, ctol) && !p.double_division;
}

// The cause read from one side's prediction (that side's multiple != 1).
Finding CauseFromPrediction(const Prediction& p, const pb::Config& cfg, pb::ParamKind kind, double ctol) {
  Finding f;
  if (p.double_division && !Near(p.reduction_factor, 1, ctol)) {
    f.cause = Cause::kDoubleDivision;
    f.dimension = Dimension::kDp;
  } else if (!Near(p.reduction_factor, 1, ctol)) {
    f.cause = StillTheFrameworksDivisor(cfg, kind, p, ctol) ? Cause::kLossMultiplier : Cause::kReductionDivisor;
    f.dimension = DegreeEqualTo(p.reduction_factor, cfg, ctol, kind == pb::EXPERT ? Dimension::kEp : Dimension::kNone);
  } else {
    f.cause = Cause::kLossMultiplier;
    const auto d = DegreesOf(cfg);
    if (Near(p.loss_factor, d.split(), ctol) && d.split() > 1) {
      f.dimension = SplitOf(cfg);
    } else {
      f.dimension = DegreeEqualTo(p.loss_factor, cfg, ctol);
    }
  }
  return f;
}

// What a side's own reductions show for `kind`: the factor its believed divisor
// is off by (expected / believed), or empty when it measured nothing.
std::optional<double> ReductionOff(const SideFacts& s, const std::string& kind, double ctol) {
  for (const auto& e : s.reductions) {
    if (e.param_kind != kind || e.believed <= 0 || e.expected <= 0) continue;
    const double off = e.expected / e.believed;
    return Near(off, 1, ctol) ? 1.0 : off;
  }
  return std::nullopt;
}

// The split dimension (sp, cp) a side's dense reductions leave out: their
// group is smaller than dp x sp x cp by that degree. kNone when none.
Dimension MissingGroupDimension(const SideFacts& s) {
  const auto d = DegreesOf(s.config);
  for (const auto& e : s.reductions) {
    if (e.param_kind != "dense" && !e.param_kind.empty()) continue;
    if (e.group_size <= 0) continue;
    const int full = d.dp * d.split();
    if (e.group_size >= full || full % e.group_size != 0) return Dimension::kNone;
    const int left_out = full / e.group_size;
    if (d.sp > 1 && left_out == d.sp) return Dimension::kSp;
    if (d.cp > 1 && left_out == d.cp) return Dimension::kCp;
    return Dimension::kNone;
  }
  return Dimension::kNone;
}

// Whether the side's expert reductions run over a group of edp x tp ranks (tp copies of each expert).
bool ExpertGroupSpansTp(const SideFacts& s) {
  const int tp = DegreesOf(s.config).tp;
  for (const auto& e : s.reductions) {
    if (e.param_kind == "expert" && e.group_size > 0) return tp > 1 && ExpertCopies(s.config, e.group_size) == tp;
  }
  return false;
}

bool LossDimension(Dimension d) { return d == Dimension::kSp || d == Dimension::kCp || d == Dimension::kGas; }

// What both sides' own reductions of a kind show (ReductionOff).
struct Evidence {
  std::optional<double> off_a, off_b;
  bool a_right = false, b_right = false;  // the side's believed divisor is what its layout needs
  const std::optional<double>& Off(char side) const { return side == 'A' ? off_a : off_b; }
  bool Right(char side) const { return side == 'A' ? a_right : b_right; }
};

// The candidate the evidence prefers among `matches` (not empty): a side whose
// reduction divides as its layout needs carries a loss multiplier, so a loss
// dimension (sp, cp, gas) of it wins over dp/world; expert gradients prefer
// ep/edp, or tp when their group spans tp copies of each expert.
const Candidate& PickCandidate(const std::vector<Candidate>& matches, const std::string& kind, const SideFacts& a,
                               const SideFacts& b, const Evidence& ev, double ctol) {
  const Candidate* best = &matches.front();
  // Expert gradients over a group that spans tp copies of the same expert (TP + MoE): a reduction off by
  // tp names tp, not the dp it may equal.
  const std::optional<double>& owner_off = ev.Off(best->side);
  if (kind == "expert" && owner_off && *owner_off != 1.0 && ExpertGroupSpansTp(best->side == 'A' ? a : b)) {
    for (const auto& m : matches) {
      if (m.kind == Dimension::kTp && Near(m.value, *owner_off, ctol)) {
        best = &m;
        break;
      }
    }
  }
  for (const auto& m : matches) {
    if (best->kind == Dimension::kTp && kind == "expert") break;
    if ((ev.Right(m.side) && LossDimension(m.kind)) ||
        (kind == "expert" && (m.kind == Dimension::kEp || m.kind == Dimension::kEdp))) {
      best = &m;
      break;
    }
  }
  return *best;
}

// A loss multiplier or a reduction divisor (or the predivide factor), for the chosen candidate.
Cause CauseOfCandidate(const Candidate& best, const std::string& kind, const SideFacts& a, const SideFacts& b,
                       const Evidence& ev, double ctol) {
  const std::optional<double>& off = ev.Off(best.side);
  if (best.kind == Dimension::kPredivide) return Cause::kPredivide;
  if (kind == "expert" &&
      (best.kind == Dimension::kEp || best.kind == Dimension::kEdp || best.kind == Dimension::kExperts)) {
    return Cause::kReductionDivisor;
  }
  if (ev.Right(best.side) && LossDimension(best.kind)) return Cause::kLossMultiplier;
  if (off && *off != 1.0) {
    // A reduction that is the plain mean over its group (what DDP, FSDP and a ZeRO reduce-scatter do) is the
    // convention a loss is written for: the loss scale is what is off, not the framework's mean.
    return IsPlainMean(best.side == 'A' ? a : b, kind, ctol) && kind != "expert" ? Cause::kLossMultiplier
                                                                                 : Cause::kReductionDivisor;
  }
  if (best.kind == Dimension::kGas || best.kind == Dimension::kCp ||
      (best.kind == Dimension::kSp && !best.reciprocal)) {
    return Cause::kLossMultiplier;
  }
  return Cause::kReductionDivisor;
}

// The cause matched by candidates, using what the sides' reductions show.
Finding CauseFromCandidates(double scale, const std::string& kind, const SideFacts& a, const SideFacts& b,
                            double ctol) {
  Finding f;
  const auto matches = MatchFactor(scale, ScaleCandidates(a.config, b.config), ctol);
  if (matches.empty()) {
    f.cause = Cause::kUnexplained;
    return f;
  }
  Evidence ev;
  ev.off_a = ReductionOff(a, kind, ctol);
  ev.off_b = ReductionOff(b, kind, ctol);
  ev.a_right = ev.off_a && *ev.off_a == 1.0;
  ev.b_right = ev.off_b && *ev.off_b == 1.0;
  const Candidate& best = PickCandidate(matches, kind, a, b, ev, ctol);
  f.expression = best.expr;
  if (best.squared) {
    f.cause = Cause::kDoubleDivision;
    f.side = best.side == 'A' ? "A" : "B";
    f.dimension = best.kind;
    return f;
  }
  if (best.kind == Dimension::kOne) {
    f.cause = Cause::kNone;
    return f;
  }
  f.side = best.side == 'A' ? "A" : best.side == 'B' ? "B" : "";
  f.dimension = best.kind;
  f.cause = CauseOfCandidate(best, kind, a, b, ev, ctol);
  return f;
}

// The reading of a loss multiplier on side `s` (the fix for a split one).
void ReadLossMultiplier(const SideFacts& s, Finding* f) {
  const pb::Config& cfg = s.config;
  const Dimension dim = f->dimension;
  if (dim == Dimension::kGas) {
    f->reading = Reading::kGasLoss;
  } else if (!IsSplit(dim)) {
    f->reading = Reading::kLossMultiplied;
  } else if (!f->Up()) {
    f->reading =
        IsPlainMean(s, f->param_kind, 1e-3) ? Reading::kSplitLossForPlainMean : Reading::kSplitLossDividedAgain;
  } else if (cfg.loss() == "local-mean" || cfg.loss() == "alst-tutorial" || dim == Dimension::kSp) {
    f->fix = SplitFix(cfg.loss(), DimensionName(dim));
    const std::string version = DeepSpeedVersion(cfg);
    if (!s.deepspeed) {
      f->reading = Reading::kLocalMeanOverShard;
    } else if (cfg.zero_stage() == 3) {
      f->reading = Reading::kLocalMeanReducedByDpZero3;
    } else {
      f->reading = Reading::kLocalMeanReducedByDp;
      if (version.empty() || HasPr4530(version)) f->change = DeepSpeedChange::kPr4530;
    }
  } else {
    f->fix = SplitFix(cfg.loss(), DimensionName(dim));
    f->reading = Reading::kLossTimesSplit;
  }
}

// The reading of a reduction divisor on side `s`.
void ReadReductionDivisor(const SideFacts& s, Finding* f) {
  const Dimension dim = f->dimension;
  const std::string& kind = f->param_kind;
  const bool expert_dim = dim == Dimension::kEp || dim == Dimension::kEdp;
  if (kind == "expert" && dim == Dimension::kTp) {
    f->reading = Reading::kExpertTpCopies;
  } else if (kind == "mixed" && expert_dim) {
    f->reading = Reading::kAllDividedByEdp;
  } else if (kind == "expert" && (expert_dim || dim == Dimension::kExperts || f->Up())) {
    f->reading = Reading::kExpertsAveragedOverEdp;
    if (s.deepspeed) f->change = DeepSpeedChange::kPrs5259And6546;
  } else if (dim == Dimension::kReplicate) {
    f->reading = Reading::kReplicateLeftOut;
  } else if (dim == Dimension::kDp) {
    f->reading = Reading::kDpDivisor;
  } else if (dim == Dimension::kWorld) {
    f->reading = Reading::kWorldDivisor;
  } else if (dim == Dimension::kSp || dim == Dimension::kCp) {
    const bool twice = !f->Up() && s.config.loss() == "local-mean-div-sp";
    f->reading = twice ? Reading::kSpDividedTwice : Reading::kSplitDivisor;
  } else if (dim == Dimension::kTp) {
    f->reading = Reading::kTpDivisor;
  } else {
    f->reading = Reading::kOtherDivisor;
  }
}

// Which sentence the finding reads as, what fixes it and which DeepSpeed change
// it cites, from the side `s` that carries it (`p`: that side's prediction when
// it settled the cause).
void Read(const SideFacts& s, const Prediction* p, Finding* f) {
  switch (f->cause) {
    case Cause::kNone:
      f->reading = Reading::kMatches;
      return;
    case Cause::kDoubleDivision:
      if (f->dimension == Dimension::kGas) {
        f->reading = Reading::kGasDividedTwice;
        if (s.deepspeed) f->change = DeepSpeedChange::kIssue7749;
        return;
      }
      f->reading = Reading::kMoeBucketDividedTwice;
      f->divisor_once = p ? std::sqrt(p->applied) : 0;
      if (s.deepspeed) {
        const std::string version = DeepSpeedVersion(s.config);
        if (version.empty() || !HasPr4957(version)) f->change = DeepSpeedChange::kPr4957;
      }
      return;
    case Cause::kLossMultiplier:
      return ReadLossMultiplier(s, f);
    case Cause::kPredivide:
      f->reading = Reading::kPredivide;
      return;
    case Cause::kReductionDivisor:
      return ReadReductionDivisor(s, f);
    case Cause::kPipelineScheduleScaling:
      f->reading = Reading::kPipelineSchedule;
      return;
    default:
      f->reading = Reading::kUnmatched;
  }
}

// The candidate named for a predicted factor: the one in the finding's dimension, else the simplest.
std::string PredictedExpression(double scale, const Finding& f, const pb::Config& a, const pb::Config& b, double ctol) {
  const auto matches = MatchFactor(scale, ScaleCandidates(a, b), ctol);
  for (const auto& m : matches) {
    if (m.kind == f.dimension || (f.dimension == Dimension::kSpCp && m.kind == Dimension::kSp)) return m.expr;
  }
  return matches.empty() ? "" : matches.front().expr;
}

// A pipeline schedule whose gradient scaling does not match its loss (PipelineMultiple): the factor is
// the pipelined side's micro-batch count n, n x when it does not scale a mean loss per micro-batch, 1/n
// when it scales a loss already divided by n. A schedule recorded as scaling cannot make its gradients
// n x (something else multiplies them), nor one recorded as not scaling 1/n: those go to the candidates.
std::optional<Finding> PipelineFinding(double scale, const SideFacts& a, const SideFacts& b, double ctol) {
  for (const SideFacts* s : {&b, &a}) {
    const pb::Config& c = s->config;
    const int n = c.pp_microbatches();
    if (n <= 1) continue;
    const double own = s == &b ? scale : 1 / scale;  // this side's gradients over the other's
    const bool up = Near(own, n, ctol), down = Near(own, 1.0 / n, ctol);
    if ((!up && !down) || (c.has_pp_scale_grads() && up == c.pp_scale_grads())) continue;
    Finding f;
    f.cause = Cause::kPipelineScheduleScaling;
    f.reading = Reading::kPipelineSchedule;
    f.side = s == &b ? "B" : "A";
    f.dimension = Dimension::kPpMicrobatches;
    f.fix = up ? "scale_grads=True on the schedule (for a mean loss per micro-batch), or a loss_fn divided by the "
                 "micro-batches with scale_grads=False"
               : "either the loss_fn's division by the micro-batches or the schedule's scale_grads=True, not both";
    return f;
  }
  return std::nullopt;
}

// The causes a degree candidate can stand for: a loss that over-counts the dimension, or a reduction that
// divides by it wrongly (gas: only the loss; the others of the layout are not candidates here).
std::vector<Cause> CausesOf(Dimension d) {
  switch (d) {
    case Dimension::kGas:
      return {Cause::kLossMultiplier};
    case Dimension::kSp:
    case Dimension::kCp:
    case Dimension::kDp:
    case Dimension::kTp:
    case Dimension::kWorld:
      return {Cause::kLossMultiplier, Cause::kReductionDivisor};
    default:
      return {};
  }
}

// Every cause the degree candidates of side `side` (the one the rules chose: B before A) stand for in a
// dense factor, each read as its own finding and marked with what rules it out: a reduction divisor on a
// side whose reductions divide as its layout needs, a loss multiple on a side whose reductions alone are off
// by the factor. Empty when a candidate is no degree cause (1, predivide, gas^2, a ratio of the two
// configurations) or fewer than two causes fit.
std::vector<Finding> Alternatives(double scale, const std::string& kind, const SideFacts& a, const SideFacts& b,
                                  const Finding& chosen, double ctol, bool others_match) {
  std::vector<Finding> out;
  if (kind == "expert" || kind == "mixed") return out;  // experts: the ep/edp rules decide (PickCandidate)
  const char side = chosen.side == "A" ? 'A' : 'B';
  const SideFacts& carrier = side == 'A' ? a : b;
  const auto matches = MatchFactor(scale, ScaleCandidates(a.config, b.config), ctol);
  const std::optional<double> off = ReductionOff(carrier, kind, ctol);
  const bool plain = IsPlainMean(carrier, kind, ctol);
  const bool local_mean = carrier.config.loss() == "local-mean" || carrier.config.loss() == "alst-tutorial";
  for (const auto& m : matches) {
    if (m.side == 'R' || m.squared || CausesOf(m.kind).empty()) return {};
    if (m.side != side) continue;
    // world when another degree gives the factor (the others are 1): the same group, not a cause of its own
    const bool also_a_degree = m.kind == Dimension::kWorld && std::any_of(matches.begin(), matches.end(), [&](auto& o) {
                                 return o.kind != Dimension::kWorld && o.side == m.side;
                               });
    if (also_a_degree) continue;
    for (const Cause cause : CausesOf(m.kind)) {
      // A local mean per shard over-counts by the split: read as a loss multiple, not also as a divisor
      if (local_mean && IsSplit(m.kind) && cause == Cause::kReductionDivisor) continue;
      Finding c;
      c.cause = cause;
      c.dimension = m.kind;
      c.side = std::string(1, side);
      c.expression = m.expr;
      c.param_kind = kind;
      c.factor = side == 'A' ? 1 / scale : scale;
      Read(carrier, nullptr, &c);
      const bool off_by_factor = off && *off != 1.0 && Near(*off, c.factor, ctol);
      if (cause == Cause::kReductionDivisor && off && *off == 1.0) c.ruled_out = RuledOut::kReductionsAsNeeded;
      if (cause == Cause::kReductionDivisor && off && *off != 1.0 && plain) {
        c.ruled_out = RuledOut::kPlainMeanConvention;
      }
      if (cause == Cause::kLossMultiplier && off_by_factor && !plain) c.ruled_out = RuledOut::kReductionsCarryFactor;
      if (cause == Cause::kLossMultiplier && others_match && c.ruled_out == RuledOut::kNo) {
        c.ruled_out = RuledOut::kOtherParamsMatch;
      }
      out.push_back(std::move(c));
    }
  }
  // A recorded local-mean recipe over a split gives the factor by itself: every other candidate would add to it.
  const bool recipe = local_mean && std::any_of(out.begin(), out.end(), [](const Finding& c) {
                        return IsSplit(c.dimension) && c.ruled_out == RuledOut::kNo;
                      });
  for (auto& c : out) {
    if (recipe && !IsSplit(c.dimension) && c.ruled_out == RuledOut::kNo) c.ruled_out = RuledOut::kRecipeGivesFactor;
  }
  // Reductions measured off by the factor are one cause whatever degree equals it: the rules' dimension names it.
  if (off && *off != 1.0) {
    std::vector<Finding> kept;
    for (auto& c : out) {
      const bool other_divisor =
          c.cause == Cause::kReductionDivisor && c.ruled_out == RuledOut::kNo && c.dimension != chosen.dimension;
      if (!other_divisor || chosen.cause != Cause::kReductionDivisor) kept.push_back(std::move(c));
    }
    out = std::move(kept);
  }
  if (out.size() < 2) out.clear();
  return out;
}

// The rerun that separates the alternatives left: double a degree that some of them follow and others do not
// (gas first: it needs no more ranks), each predicting its B/A after it; or, when they differ only in cause
// (a loss multiple or a divisor of one dimension), recording the reductions.
void NameRerun(double scale, const SideFacts& a, const SideFacts& b, Finding* f) {
  std::vector<Finding*> left;
  for (auto& alt : f->alternatives) {
    if (alt.ruled_out == RuledOut::kNo) left.push_back(&alt);
  }
  for (const Dimension d : {Dimension::kGas, Dimension::kDp, Dimension::kSp, Dimension::kCp, Dimension::kTp}) {
    const Finding* follows = nullptr;
    bool other = false;
    for (const Finding* alt : left) {
      if (alt->dimension == d) follows = alt;
      if (alt->dimension != d) other = true;
    }
    if (follows == nullptr || !other) continue;
    const SideFacts& s = follows->side == "A" ? a : b;
    double value = 1;
    for (const auto& degree : ConfigDegrees()) {
      if (degree.dim == d) value = degree.get(s.config);
    }
    f->rerun = d;
    f->rerun_side = follows->side;
    f->rerun_value = static_cast<int>(2 * value);
    for (Finding* alt : left) {
      const bool reciprocal = alt->expression.rfind("1/", 0) == 0;
      alt->rerun_factor = alt->dimension != d ? scale : reciprocal ? scale / 2 : scale * 2;
    }
    return;
  }
  f->rerun_with_reductions = true;
}

// Settles a finding whose factor several causes fit: the one the traces leave, or kAmbiguous with the rerun.
void Settle(double scale, const SideFacts& a, const SideFacts& b, std::vector<Finding> alternatives, bool others_match,
            Finding* f) {
  auto count_left = [&] {
    return std::count_if(alternatives.begin(), alternatives.end(),
                         [](const Finding& x) { return x.ruled_out == RuledOut::kNo; });
  };
  auto left = count_left();
  // Only part of the model carries the factor and the recorded reductions divide as needed: it enters outside
  // them, so the divisors they would have ruled out stay (marked), and the rerun tells them apart.
  if (left == 0 && others_match) {
    for (auto& x : alternatives) {
      if (x.cause == Cause::kReductionDivisor && x.ruled_out == RuledOut::kReductionsAsNeeded) {
        x.ruled_out = RuledOut::kNo;
        x.outside_recorded = true;
      }
    }
    left = count_left();
  }
  if (left == 0) return;  // the evidence contradicts every candidate: the rules' own choice stands
  if (left == 1) {
    Finding chosen = *std::find_if(alternatives.begin(), alternatives.end(),
                                   [](const Finding& x) { return x.ruled_out == RuledOut::kNo; });
    chosen.alternatives = std::move(alternatives);
    *f = std::move(chosen);
    return;
  }
  Finding amb;
  amb.cause = Cause::kAmbiguous;
  amb.reading = Reading::kAmbiguous;
  amb.param_kind = f->param_kind;
  amb.factor = scale;
  amb.alternatives = std::move(alternatives);
  NameRerun(scale, a, b, &amb);
  *f = std::move(amb);
}

// B's recorded loss per data-parallel replica over A's, when both recorded one and it equals `scale`
// (within 1e-3 relative).
std::optional<double> LossRatio(const SideFacts& a, const SideFacts& b, double scale) {
  if (a.loss_per_replica <= 0 || b.loss_per_replica <= 0) return std::nullopt;
  const double ratio = b.loss_per_replica / a.loss_per_replica;
  if (std::fabs(ratio - scale) > 1e-3 * scale) return std::nullopt;
  return ratio;
}

}  // namespace

Finding ExplainFactor(double scale, const std::string& param_kind, const SideFacts& a, const SideFacts& b, double ctol,
                      bool others_match) {
  // The recorded layouts' prediction settles the cause when it equals the factor.
  const pb::ParamKind kind = KindOf(param_kind);
  const auto pa = Predict(a.config, kind), pb_ = Predict(b.config, kind);
  std::optional<double> predicted;
  if (pa && pb_ && pa->multiple > 0) predicted = pb_->multiple / pa->multiple;
  Finding f;
  const Prediction* used = nullptr;
  const SideFacts* side = &b;
  if (auto pipeline = PipelineFinding(scale, a, b, ctol)) {
    f = *pipeline;
    side = f.side == "A" ? &a : &b;
    const auto ma = PipelineMultiple(a.config), mb = PipelineMultiple(b.config);
    predicted = ma && mb && *ma > 0 ? std::optional<double>(*mb / *ma) : std::nullopt;
    f.expression = PredictedExpression(scale, f, a.config, b.config, ctol);
  } else if (predicted && Near(scale, *predicted, ctol) && !Near(scale, 1, ctol)) {
    const bool b_off = !Near(pb_->multiple, 1, ctol);
    const bool a_off = !Near(pa->multiple, 1, ctol);
    used = b_off ? &*pb_ : &*pa;
    side = b_off ? &b : &a;
    f = CauseFromPrediction(*used, side->config, kind, ctol);
    f.side = b_off && a_off ? "" : b_off ? "B" : "A";
    f.expression = PredictedExpression(scale, f, a.config, b.config, ctol);
  } else {
    f = CauseFromCandidates(scale, param_kind, a, b, ctol);
    f.param_kind = param_kind;
    side = f.side == "A" ? &a : &b;
    if (f.cause == Cause::kLossMultiplier || f.cause == Cause::kReductionDivisor) {
      auto alternatives = Alternatives(scale, param_kind, a, b, f, ctol, others_match);
      if (!alternatives.empty()) Settle(scale, a, b, std::move(alternatives), others_match, &f);
      if (f.cause == Cause::kAmbiguous) {
        f.predicted = predicted;
        f.prediction_differs = predicted && !Near(scale, *predicted, ctol);
        return f;
      }
      side = f.side == "A" ? &a : &b;
    }
  }
  // No layout degree fits, but the losses each side recorded differ by the factor: the loss passed to
  // backward carries it (a sum over samples or tokens where the other side takes a mean, a hand-written scale).
  const bool scaled_loss = f.cause == Cause::kUnexplained && !Near(scale, 1, ctol) && LossRatio(a, b, scale);
  if (scaled_loss) {
    f.cause = Cause::kLossMultiplier;
    f.side = scale > 1 ? "B" : "A";
    side = f.side == "A" ? &a : &b;
  }
  f.param_kind = param_kind;
  f.predicted = predicted;
  f.prediction_differs = predicted && !Near(scale, *predicted, ctol);
  // A factor of an A-side atom means A carries the error (B/A = 1/x(A)): the finding in A's direction.
  f.factor = f.side == "A" ? 1 / scale : scale;
  Read(*side, used, &f);
  if (scaled_loss) f.reading = Reading::kLossScaledOutsideLayout;
  // The recorded losses confirm a loss multiplier when their ratio is the factor (they never refute one:
  // a producer's loss values may be scaled for logging).
  if (f.cause == Cause::kLossMultiplier) f.loss_ratio = LossRatio(a, b, scale);
  return f;
}

Finding ExplainMismatch(const SideFacts& a, const SideFacts& b) {
  Finding f;
  f.cause = Cause::kUnexplained;
  f.reading = Reading::kNotAMultiple;
  // Lossy compression (PowerSGD's low-rank approximation) makes gradients approximations, not multiples.
  for (const SideFacts* s : {&b, &a}) {
    if (!LossyCompression(s->config.comm_hook())) continue;
    f.cause = Cause::kLossyCompression;
    f.reading = Reading::kLossyCompression;
    f.side = s == &b ? "B" : "A";
    return f;
  }
  // A reduction group that leaves out a split dimension: those ranks keep their own partial gradients.
  for (const SideFacts* s : {&b, &a}) {
    const Dimension missing = MissingGroupDimension(*s);
    if (missing == Dimension::kNone) continue;
    f.cause = Cause::kIncompleteGroup;
    f.reading = Reading::kIncompleteGroup;
    f.side = s == &b ? "B" : "A";
    f.dimension = missing;
    return f;
  }
  // What the deviation follows, when the traces can tell: unequal valid-token counts per micro-batch/shard.
  for (const SideFacts* s : {&b, &a}) {
    if (s->valid_tokens_min <= 0 || s->valid_tokens_max <= s->valid_tokens_min) continue;
    f.cause = Cause::kTokenNormalisation;
    f.reading = Reading::kTokenNormalisation;
    f.side = s == &b ? "B" : "A";
    f.dimension = s->config.gas() > 1                ? Dimension::kGas
                  : DegreesOf(s->config).split() > 1 ? Dimension::kSp
                                                     : Dimension::kDp;
    return f;
  }
  return f;
}

std::string ExplainedKind(const std::set<std::string>& kinds, const pb::Config& b) {
  const bool modelled = Predict(b, pb::EXPERT).has_value();
  if (kinds.count("expert")) return kinds.size() > 1 && !modelled ? "mixed" : "expert";
  return kinds.size() == 1 ? *kinds.begin() : "dense";
}

bool CitesDeepSpeed(const std::string& producer, const std::string& framework, const pb::Config& c) {
  std::string who = producer + " " + framework;
  std::transform(who.begin(), who.end(), who.begin(), [](unsigned char ch) { return std::tolower(ch); });
  if (who.find("deepspeed") != std::string::npos) return true;
  auto p = ResolvePolicy(c.scaling());
  return p.ok() && p->models_deepspeed;
}

bool LossyCompression(const std::string& comm_hook) {
  return comm_hook.find("powerSGD") != std::string::npos || comm_hook.find("PowerSGD") != std::string::npos;
}

}  // namespace gradtrace::semantics
