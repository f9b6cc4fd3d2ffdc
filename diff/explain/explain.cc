#include "explain/explain.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <set>

#include "cause.h"
#include "explain/localise.h"
#include "factor_finding.h"

namespace gradtrace::diff {
namespace {

using semantics::Reading;

// A side as semantics/'s rules read it.
semantics::SideFacts Facts(const TraceSide& s) {
  semantics::SideFacts f;
  f.config = s.config;
  f.deepspeed = CitesDeepSpeed(s);
  for (const auto& e : s.reductions) f.reductions.push_back({e.param_kind, e.group_size, e.Believed(), e.expected});
  f.loss_per_replica = s.loss_per_replica;
  f.valid_tokens_min = s.valid_tokens_min;
  f.valid_tokens_max = s.valid_tokens_max;
  return f;
}

std::string GroupWords(const std::string& kind) {
  if (kind == "expert") return "expert gradients";
  if (kind == "tp-shard") return "tensor-parallel shards";
  if (kind == "replicated") return "replicated parameters";
  return "";
}

// One sentence per reading (semantics/factor_finding.h). Placeholders: {who} the side carrying it, {dim} its
// dimension, {on} " on the <parameter group>", {fix} the recipe that fixes it, {cite} the DeepSpeed change
// behind it (`cite`, when the finding names one), and the few that one sentence needs.
struct Sentence {
  Reading reading;
  const char* up;    // the side's gradients come out larger than the mean-loss gradient; either way without `down`
  const char* down;  // smaller
  const char* cite;  // {cite}'s words, with {ref}, {first}, {broken} from the change table
};

constexpr Sentence kSentences[] = {
    {Reading::kUnmatched,
     "matches no expression of the two configurations (sp, cp, dp, tp, replicate, world, gas, gas^2, "
     "predivide factor, ep, edp, experts)",
     nullptr, nullptr},
    {Reading::kMatches, "B matches A", nullptr, nullptr},
    {Reading::kGasDividedTwice,
     "{who}'s gradients are divided by the gradient-accumulation steps twice more than the mean loss needs "
     "(1/gas^2): a division by gas is applied in more than one place; divide by gas once{cite}",
     nullptr, " (as DeepSpeed {broken}'s output hook did, issue {ref}, fixed in {first})"},
    {Reading::kMoeBucketDividedTwice,
     "{who} divides MoE buckets twice: ZeRO-1/2 divides the bucket by group size / sp ({divisor}) and again in "
     "allreduce_bucket, so {these} gradients are 1/dp of the mean-loss gradient{cite}",
     nullptr, " (DeepSpeed before PR {ref}, fixed in {first})"},
    {Reading::kGasLoss,
     "{who}'s loss is not divided by the gradient-accumulation steps (gas), so its micro-steps add up to gas x the "
     "gradient; divide the loss by gas",
     "{who} divides by the accumulation steps twice (loss and gradient)", nullptr},
    {Reading::kSplitLossDividedAgain, "{who}'s loss divides by {dim} once more than needed", nullptr, nullptr},
    {Reading::kSplitLossForPlainMean,
     "{who}'s loss divides by {dim} once more than needed (its reduction is the plain mean over its group, as "
     "DDP/FSDP do: scale the loss for that mean)",
     nullptr, nullptr},
    {Reading::kLocalMeanReducedByDp,
     "the per-rank loss is a local mean and the reduction divides by dp only{cite}; use {fix}", nullptr,
     " (DeepSpeed ZeRO-1/2 since {ref})"},
    {Reading::kLocalMeanReducedByDpZero3,
     "the per-rank loss is a local mean and the reduction divides by dp only (DeepSpeed ZeRO-3 with reduce_scatter "
     "false, stage3.py all-reduce path); use {fix}",
     nullptr, nullptr},
    {Reading::kLocalMeanOverShard,
     "the per-rank loss is a local mean over its sequence shard, so the {dim} ranks' gradients add up to {dim} x "
     "the sequence's, and the reduction divides by dp; use {fix}",
     nullptr, nullptr},
    {Reading::kLossTimesSplit,
     "{who}'s loss is multiplied by {dim} (its {dim} ranks' gradients add up to {dim} x the sequence's) while its "
     "reduction divides as its layout needs; divide the loss by {dim} or use a loss weighted by the whole "
     "sequence's valid tokens",
     nullptr, nullptr},
    {Reading::kLossMultiplied, "{who}'s loss is multiplied by {dim_or_factor}",
     "{who}'s loss is divided by {dim_or_factor}", nullptr},
    {Reading::kAmbiguous, "several causes fit", nullptr, nullptr},  // AmbiguityWords says which
    {Reading::kLossScaledOutsideLayout,
     "{who}'s loss passed to backward is scaled by {dim_or_factor}, which no layout degree gives (e.g. a sum over "
     "samples or tokens where a mean is meant)",
     nullptr, nullptr},
    {Reading::kPredivide, "{who} multiplies back the gradient_predivide_factor that was never divided out",
     "{who} pre-divides by gradient_predivide_factor and never multiplies back", nullptr},
    {Reading::kExpertTpCopies,
     "{who}'s expert gradients are reduced over dp x tp ranks that hold tp copies of each expert, but divided by dp "
     "only: they come out tp x the mean-loss gradient; divide by dp x tp or reduce expert gradients over the "
     "expert-data-parallel ranks only",
     "{who} divides its expert gradients by tp although the tensor-parallel ranks do not share them", nullptr},
    {Reading::kAllDividedByEdp,
     "{who} divides every gradient (dense and expert) by the expert-data-parallel size (dp / ep) instead of dp: "
     "they come out ep x the mean-loss gradient; divide by dp",
     "{who} divides every gradient by ep once more than needed", nullptr},
    {Reading::kExpertsAveragedOverEdp,
     "{who}'s expert gradients are averaged over the expert-data-parallel group (edp) instead of the dense "
     "data-parallel ranks: they come out ep x the mean-loss gradient; divide expert gradients by dp{cite}",
     nullptr, " (the mistake DeepSpeed PRs {ref} fixed)"},
    {Reading::kReplicateLeftOut,
     "{who}'s gradients are reduce-scattered over the shard group and divided by its size only, then all-reduced "
     "(summed) over the HSDP replicas: they come out replicate x the mean-loss gradient; divide by shard x "
     "replicate (the data-parallel degree)",
     "{who} divides by the HSDP replicate degree once more than needed{on}", nullptr},
    {Reading::kDpDivisor, "{who} sums the data-parallel ranks' gradients without dividing by dp{on}",
     "{who} divides by dp once more than needed{on}", nullptr},
    {Reading::kWorldDivisor, "{who} sums over all ranks without dividing (a 'sum' reduction){on}",
     "{who} divides by the world size once more than needed{on}", nullptr},
    {Reading::kSplitDivisor, "{who}'s reduction does not divide by {dim}{on}",
     "{who} divides by its {degree}-parallel degree once more than needed{on}", nullptr},
    {Reading::kSpDividedTwice,
     "{who} divides by sp twice: the loss recipe divides by sp and the reduction averages over dp x sp", nullptr,
     nullptr},
    {Reading::kTpDivisor, "{who} sums the tensor-parallel ranks' identical gradients{on}",
     "{who} divides by tp although the tensor-parallel ranks do not share these gradients{on}", nullptr},
    {Reading::kOtherDivisor, "{who}'s reduction divides by less than its layout needs{on}",
     "{who}'s reduction divides by more than its layout needs{on}", nullptr},
    {Reading::kPipelineSchedule,
     "{who}'s pipeline schedule ({schedule}) adds up its {n} micro-batches' gradients without dividing by them "
     "({scaling}) while its loss is a mean per micro-batch, so its gradients are {n} x the mean-loss gradient; set "
     "scale_grads=True on the schedule, or divide the loss_fn's result by the micro-batches",
     "{who}'s loss_fn divides by the {n} micro-batches and its pipeline schedule ({schedule}) divides their sum by "
     "them again ({scaling}), so its gradients are 1/{n} of the mean-loss gradient; do one of the two",
     nullptr},
    // Mismatch groups: what follows "N parameters of B are not a multiple of A (residual above tolerance)".
    {Reading::kNotAMultiple, "", nullptr, nullptr},
    {Reading::kLossyCompression,
     "; {who} communicates through {hook}, a lossy low-rank compression (with error feedback): its gradients "
     "approximate the exact ones, so they are not a multiple of them; compare against a run without it to measure "
     "the approximation, not a scaling bug",
     nullptr, nullptr},
    {Reading::kIncompleteGroup,
     "; {who}'s dense gradients are reduced over a group that leaves out its {dim} ranks, so each {dim} rank keeps "
     "its own partial gradient (the replicas disagree); reduce over dp x {dim}",
     nullptr, nullptr},
    {Reading::kTokenNormalisation,
     "; {who}'s valid-token counts differ across its {shards} ({min} to {max}): the loss is likely normalised per "
     "micro-batch/shard, not by the total valid tokens (weight each micro-batch's token-loss sum by the total valid "
     "tokens)",
     nullptr, nullptr},
};

const Sentence& SentenceOf(Reading reading) {
  for (const Sentence& s : kSentences) {
    if (s.reading == reading) return s;
  }
  std::fprintf(stderr, "gradtrace-diff: internal error: no sentence for reading %d\n", static_cast<int>(reading));
  std::abort();  // every reading has a row
}

// The finding in words; `carrier` is the side whose configuration carries it.
std::string FindingWords(const semantics::Finding& f, const TraceSide& carrier) {
  const Sentence& s = SentenceOf(f.reading);
  const std::string group = GroupWords(f.param_kind);
  std::map<std::string, std::string> words = {
      {"who", f.side.empty() ? "B" : f.side},
      {"dim", semantics::DimensionName(f.dimension)},
      {"on", group.empty() ? "" : " on the " + group},
      {"fix", f.fix},
      {"cite", CiteChange(s.cite, f.change)},
      {"dim_or_factor",
       f.dimension == semantics::Dimension::kNone ? FormatFixed(f.factor) : semantics::DimensionName(f.dimension)},
      {"divisor", FormatFixed(f.divisor_once)},
      {"these", f.param_kind == "expert" ? "expert" : "these"},
      {"degree", f.dimension == semantics::Dimension::kSp ? "sequence" : "context"},
      {"hook", carrier.config.comm_hook()},
      {"shards", f.dimension == semantics::Dimension::kGas
                     ? std::string("gas micro-batches")
                     : semantics::DimensionName(f.dimension) + std::string(" shards")},
      {"min", std::to_string(carrier.valid_tokens_min)},
      {"max", std::to_string(carrier.valid_tokens_max)},
      {"n", std::to_string(carrier.config.pp_microbatches())},
      {"schedule", carrier.config.pp_schedule().empty() ? "schedule not recorded" : carrier.config.pp_schedule()},
      {"scaling", !carrier.config.has_pp_scale_grads() ? "scale_grads not recorded"
                  : carrier.config.pp_scale_grads()    ? "scale_grads=True"
                                                       : "scale_grads=False"},
  };
  return FillSentence(s.down != nullptr && !f.Up() ? s.down : s.up, words);
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

// The "scale" groups: match/scaled parameters clustered by factor, each explained.
void AddScaleGroups(const std::vector<ParamResult>& params, const TraceSide& a, const TraceSide& b, double ctol,
                    std::vector<Group>* groups) {
  const int total = static_cast<int>(params.size());
  std::vector<const ParamResult*> scalable;
  for (const auto& p : params) {
    if ((p.verdict == Verdict::kMatch || p.verdict == Verdict::kScaled) && std::isfinite(p.metrics.scale) && !p.zero) {
      scalable.push_back(&p);
    }
  }
  std::sort(scalable.begin(), scalable.end(),
            [](const ParamResult* x, const ParamResult* y) { return x->metrics.scale < y->metrics.scale; });
  // Some parameters match: a factor carried by the others cannot be a loss multiple (it scales every gradient).
  const bool any_match = std::any_of(scalable.begin(), scalable.end(),
                                     [&](const ParamResult* p) { return std::fabs(p->metrics.scale - 1) <= ctol; });
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
    Cause k;
    const bool others_match = any_match && std::fabs(*g.scale - 1) > ctol;
    g.explanation =
        ExplainScale(*g.scale, g.count, total, semantics::ExplainedKind(kinds, b.config), a, b, ctol, &k, others_match);
    g.expression = k.expression;
    g.cause = k.cause;
    g.dimension = k.dimension == semantics::Dimension::kSpCp ? semantics::Dimension::kSp : k.dimension;
    g.side = k.side;
    g.predicted = k.predicted;
    g.candidates = std::move(k.candidates);
    g.rerun = std::move(k.rerun);
    groups->push_back(std::move(g));
    i = j;
  }
}

// One group each for mismatch, missing and nonfinite parameters; a mismatch explained when the traces can tell.
void AddProblemGroups(const std::vector<ParamResult>& params, const TraceSide& a, const TraceSide& b,
                      std::vector<Group>* groups) {
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
      const semantics::Finding f = semantics::ExplainMismatch(Facts(a), Facts(b));
      g.cause = f.cause;
      g.side = f.side;
      g.dimension = f.dimension;
      g.explanation = n + " of B" + are + " not a multiple of A (residual above tolerance)" +
                      FindingWords(f, f.side == "A" ? a : b);
      std::vector<std::pair<std::string, bool>> order;  // the model's order (the alignment's)
      for (const auto& p : params) order.emplace_back(p.name, p.verdict == Verdict::kMismatch);
      g.localisation = LocateMismatch(order);
      if (g.localisation) g.explanation += LocalisationWords(*g.localisation);
    }
    if (v == Verdict::kMissing) g.explanation = n + " could not be compared (absent, shape differs, or incomplete)";
    if (v == Verdict::kNonfinite) g.explanation = n + " hold NaN or Inf";
    groups->push_back(std::move(g));
  }
}

}  // namespace

std::string TiedCopiesWords(const pb::ParamInfo& param) {
  if (param.stages_size() != 2) return "";
  return ": a tied parameter, whose copies pipeline stages " + std::to_string(param.stages(0)) + " and " +
         std::to_string(param.stages(1)) +
         " hold; each copy has only its stage's share of the gradient unless "
         "the training sums them (all-reduce the copies' gradients over those stages, as Megatron's embedding "
         "group does; torch.distributed.pipelining does not)";
}

std::string FillSentence(const char* text, const std::map<std::string, std::string>& words) {
  std::string out;
  for (const char* p = text; *p != '\0'; ++p) {
    const char* close = *p == '{' ? std::strchr(p, '}') : nullptr;
    auto it = close != nullptr ? words.find(std::string(p + 1, close)) : words.end();
    if (it == words.end()) {
      out += *p;
      continue;
    }
    out += it->second;
    p = close;
  }
  return out;
}

std::string CiteChange(const char* text, const std::optional<semantics::DeepSpeedChange>& change) {
  if (text == nullptr || !change) return "";
  const auto& row = semantics::DeepSpeedChangeOf(*change);
  return FillSentence(text, {{"ref", row.ref}, {"first", row.first}, {"broken", row.broken}});
}

bool CitesDeepSpeed(const TraceSide& s) { return semantics::CitesDeepSpeed(s.producer, s.framework, s.config); }

namespace {

const char* CauseWords(semantics::Cause c) {
  return c == semantics::Cause::kLossMultiplier ? "a loss multiple" : "a reduction divisor";
}

std::string RuledOutBy(const semantics::Finding& alt) {
  switch (alt.ruled_out) {
    case semantics::RuledOut::kReductionsAsNeeded:
      return alt.side + "'s reductions divide as its layout needs";
    case semantics::RuledOut::kReductionsCarryFactor:
      return alt.side + "'s reductions alone are off by the whole factor";
    case semantics::RuledOut::kPlainMeanConvention:
      return alt.side + "'s reductions are the plain mean over their group, the convention a loss is written for";
    case semantics::RuledOut::kOtherParamsMatch:
      return "the other parameters match, and a loss multiple would scale every gradient";
    case semantics::RuledOut::kRecipeGivesFactor:
      return alt.side + "'s recorded loss recipe, a local mean per shard, over-counts by the split already";
    case semantics::RuledOut::kNo:
      break;
  }
  return "";
}

// The candidates of a finding several causes fit (semantics::Finding::alternatives), their sentences and the
// rerun that separates those the traces leave.
// A divisor applied outside the side's recorded reductions (semantics::Finding::outside_recorded).
std::string OutsideWords(const semantics::Finding& f) {
  return f.outside_recorded ? ", outside its recorded reductions (which divide as its layout needs)" : "";
}

void AlternativesInto(const semantics::Finding& f, const TraceSide& a, const TraceSide& b, Cause* k) {
  for (const auto& alt : f.alternatives) {
    CandidateCause c;
    c.cause = alt.cause;
    c.dimension = alt.dimension;
    c.side = alt.side;
    c.expression = alt.expression;
    c.explanation = FindingWords(alt, alt.side == "A" ? a : b) + OutsideWords(alt);
    c.ruled_out_by = RuledOutBy(alt);
    c.rerun_predicts = alt.rerun_factor;
    k->candidates.push_back(std::move(c));
  }
  if (f.rerun != semantics::Dimension::kNone) {
    std::string predicts;
    std::set<std::string> said;
    for (const auto& c : k->candidates) {
      if (!c.rerun_predicts || !said.insert(c.expression).second) continue;
      predicts += (predicts.empty() ? "" : ", ") + c.expression + " predicts " + FormatFixed(*c.rerun_predicts);
    }
    k->rerun = "rerun " + f.rerun_side + " with " + semantics::DimensionName(f.rerun) + " " +
               std::to_string(f.rerun_value) + ": " + predicts;
  } else if (f.rerun_with_reductions) {
    const std::string who = f.alternatives.empty() ? "B" : f.alternatives.front().side;
    k->rerun = "record " + who + "'s reductions (PRE_REDUCE and POST_REDUCE): gradtrace-diff --self then measures " +
               "its divisor, which tells a loss multiple from a reduction divisor";
  }
}

// "; ruled out by the traces: dp(B) as a reduction divisor (B's reductions divide as its layout needs)".
std::string RuledOutWords(const Cause& k) {
  std::string out;
  for (const auto& c : k.candidates) {
    if (c.ruled_out_by.empty()) continue;
    out += (out.empty() ? "; ruled out by the traces: " : ", ") + c.expression + " as " + CauseWords(c.cause) + " (" +
           c.ruled_out_by + ")";
  }
  return out;
}

// Cause kAmbiguous: every candidate left, in words, what rules the others out, and the rerun.
std::string AmbiguityWords(const Cause& k) {
  std::string left;
  int n = 0;
  for (const auto& c : k.candidates) {
    if (!c.ruled_out_by.empty()) continue;
    left += (left.empty() ? "" : "; or ") + c.expression + " as " + CauseWords(c.cause) + ": " + c.explanation;
    ++n;
  }
  std::string out = std::to_string(n) + " causes fit and the traces do not tell them apart: " + left + RuledOutWords(k);
  if (!k.rerun.empty()) out += "; to tell them apart, " + k.rerun;
  return out;
}

}  // namespace

double ClusterTolerance(double rtol) { return std::clamp(10 * rtol, 1e-6, 0.01); }

Cause ExplainCause(double scale, const std::string& param_kind, const TraceSide& a, const TraceSide& b, double ctol,
                   bool others_match) {
  const semantics::Finding f = semantics::ExplainFactor(scale, param_kind, Facts(a), Facts(b), ctol, others_match);
  Cause k;
  k.expression = f.expression;
  k.cause = f.cause;
  k.dimension = f.dimension;
  k.side = f.side;
  k.predicted = f.predicted;
  AlternativesInto(f, a, b, &k);
  if (f.cause == semantics::Cause::kAmbiguous) {
    k.why = AmbiguityWords(k);
  } else {
    k.why = FindingWords(f, f.side == "A" ? a : b) + OutsideWords(f) + RuledOutWords(k);
  }
  if (f.prediction_differs) k.why += "; the configurations predict B/A = " + FormatFixed(*f.predicted);
  if (f.loss_ratio) {
    k.why +=
        "; the recorded losses agree (B's loss per data-parallel replica is " + FormatFixed(*f.loss_ratio) + " x A's)";
  }
  return k;
}

std::string ExplainScale(double scale, int count, int total, const std::string& param_kind, const TraceSide& a,
                         const TraceSide& b, double ctol, Cause* cause, bool others_match) {
  std::string which = count == total ? "for all " + std::to_string(total) + " parameters"
                                     : "for " + std::to_string(count) + " of " + std::to_string(total) + " parameters";
  if (count == 1 && total == 1) which = "for the only parameter";
  const std::string group = GroupWords(param_kind);
  if (!group.empty() && count != total) which += " (" + group + ")";
  Cause k = ExplainCause(scale, param_kind, a, b, ctol, others_match);
  std::string s =
      "B/A = " + FormatFixed(scale) + (k.expression.empty() ? "" : " = " + k.expression) + " " + which + ": " + k.why;
  if (cause) *cause = std::move(k);
  return s;
}

std::vector<Group> GroupParams(const std::vector<ParamResult>& params, const TraceSide& a, const TraceSide& b,
                               double rtol) {
  std::vector<Group> groups;
  std::map<std::string, int> severity;
  for (const auto& p : params) severity[p.name] = Severity(p.verdict);
  AddScaleGroups(params, a, b, ClusterTolerance(rtol), &groups);
  AddProblemGroups(params, a, b, &groups);
  std::stable_sort(groups.begin(), groups.end(), [&](const Group& x, const Group& y) {
    const int rx = GroupRank(x, severity), ry = GroupRank(y, severity);
    if (rx != ry) return rx > ry;
    return x.count > y.count;
  });
  return groups;
}

}  // namespace gradtrace::diff
