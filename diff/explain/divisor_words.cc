#include "explain/divisor_words.h"

#include <cstdio>
#include <cstdlib>

#include "divisor_finding.h"
#include "explain/explain.h"

namespace gradtrace::diff {
namespace {

// One sentence per divisor rule (semantics/divisor_finding.h); {cite} is `cite` when the finding names the
// DeepSpeed change behind it.
struct DivisorSentence {
  semantics::DivisorRule rule;
  const char* why;
  const char* cite;
};

constexpr DivisorSentence kDivisorSentences[] = {
    {semantics::DivisorRule::kUnmatched, "matches no expression of the configuration (group size, dp, sp, gas)",
     nullptr},
    {semantics::DivisorRule::kPartialSumsAdded,
     "the group's ranks hold partial sums of the gradient (e.g. a norm or bias replicated under tensor/sequence "
     "parallelism: each rank's share from its own tokens) and the reduction adds them, as the mean loss needs",
     nullptr},
    {semantics::DivisorRule::kPartialSumsAveraged,
     "the reduction averages the group's partial sums of the gradient (e.g. a norm under tensor/sequence "
     "parallelism) instead of adding them",
     nullptr},
    {semantics::DivisorRule::kCopiesAdded,
     "the group's ranks hold identical copies of the gradient (each computed it whole; no reduction was needed) "
     "and the reduction adds them",
     nullptr},
    {semantics::DivisorRule::kExpertsByDp,
     "expert gradients are divided by the dense data-parallel degree, as the mean loss needs", nullptr},
    {semantics::DivisorRule::kExpertsOverEdp,
     "expert gradients are averaged over their expert-data-parallel group instead of divided by dp: ep x the "
     "mean-loss gradient{cite}",
     " (the mistake DeepSpeed PRs {ref} fixed)"},
    {semantics::DivisorRule::kGroupMean, "the reduction averages over the group", nullptr},
    {semantics::DivisorRule::kShardOnly,
     "the reduction divides by the shard group only and the all-reduce over the replicas sums (an HSDP divide "
     "factor that leaves out the replicate degree)",
     nullptr},
    {semantics::DivisorRule::kDpOnlyOverSp, "the reduction divides by dp only (group size / sp{cite})",
     ", as DeepSpeed does since {ref}"},
    {semantics::DivisorRule::kDpOnlyOverCp,
     "the reduction divides by dp only (group size / cp): the context-parallel ranks' shares are summed", nullptr},
    {semantics::DivisorRule::kSum, "the reduction sums without dividing", nullptr},
    {semantics::DivisorRule::kDividedTwice, "the bucket is divided twice{cite}",
     " (the MoE-bucket division DeepSpeed PR {ref} removed)"},
    {semantics::DivisorRule::kSpOnly, "the reduction divides by the sequence-parallel degree only", nullptr},
    {semantics::DivisorRule::kAlsoGas, "the reduction also divides by the accumulation steps", nullptr},
};

std::string DivisorWhy(const semantics::DivisorFinding& f) {
  for (const DivisorSentence& s : kDivisorSentences) {
    if (s.rule == f.rule) return FillSentence(s.why, {{"cite", CiteChange(s.cite, f.change)}});
  }
  std::fprintf(stderr, "gradtrace-diff: internal error: no sentence for divisor rule %d\n", static_cast<int>(f.rule));
  std::abort();  // every rule has a row
}

}  // namespace

std::string ExplainDivisor(double d, int count, int total, const SelfParam& p, const pb::Config& c, bool deepspeed,
                           double ctol, Group* g) {
  const semantics::DivisorFinding f = semantics::ExplainDivisor(
      {d, p.param_kind, p.group, p.group_size, p.expected, p.model_parallel, p.identical_inputs}, c, deepspeed, ctol);
  std::string which = count == total ? "for all " + std::to_string(total) + " parameters"
                                     : "for " + std::to_string(count) + " of " + std::to_string(total) + " parameters";
  if (!p.param_kind.empty() && count != total) which += " (" + p.param_kind + ")";
  std::string ctx = " (group '" + p.group + "'" + (f.with_replicas ? " with its replicas" : "") + " of " +
                    std::to_string(p.group_size) + " ranks, scaling '" + c.scaling() + "', loss '" + c.loss() +
                    "', which needs " + FormatFixed(p.expected) + ")";
  g->cause = f.cause;
  g->dimension = f.dimension;
  g->expression = f.expression;
  g->param_kind = p.param_kind;
  if (p.expected > 0) g->predicted = p.expected;
  std::string s = "effective divisor " + FormatFixed(d) + (f.expression.empty() ? "" : " = " + f.expression) + " " +
                  which + ctx + ": " + DivisorWhy(f);
  if (p.expected > 0 && !f.right) {
    s += "; the optimizer sees " + FormatFixed(f.multiple) + " times the gradient of the mean loss";
  }
  return s;
}

}  // namespace gradtrace::diff
