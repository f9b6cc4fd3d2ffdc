#include "divisor_finding.h"

#include <cmath>

#include "degrees.h"
#include "factor_finding.h"

namespace gradtrace::semantics {
namespace {

// Whether the measured divisor equals `x` (> 0) within relative ctol.
struct NearDivisor {
  double d, ctol;
  bool operator()(double x) const { return x > 0 && std::fabs(d - x) <= ctol * x; }
};

// The first rule the divisor matches, in order of preference.
DivisorRule MatchRule(const MeasuredDivisor& m, const pb::Config& c, const NearDivisor& near, bool right) {
  const auto deg = DegreesOf(c);
  const int sp = deg.sp, dp = deg.dp, g = m.group_size;
  const bool expert = m.param_kind == "expert";
  // A model-parallel group (ModelParallelReduction): its ranks' partial sums are added (divisor 1).
  const bool partial_sums = m.model_parallel && !m.identical_inputs;
  if (partial_sums && right) return DivisorRule::kPartialSumsAdded;
  if (partial_sums && near(g)) return DivisorRule::kPartialSumsAveraged;
  if (m.model_parallel && m.identical_inputs && near(1) && !right) return DivisorRule::kCopiesAdded;
  if (expert && right) return DivisorRule::kExpertsByDp;
  if (expert && near(g)) return DivisorRule::kExpertsOverEdp;
  if (near(g)) return DivisorRule::kGroupMean;
  if (deg.replicate > 1 && near(g / double(deg.replicate))) return DivisorRule::kShardOnly;
  if (sp > 1 && near(g / double(sp))) return DivisorRule::kDpOnlyOverSp;
  if (deg.cp > 1 && near(g / double(deg.cp))) return DivisorRule::kDpOnlyOverCp;
  if (near(1)) return DivisorRule::kSum;
  // Only with sp > 1: at sp 1 these expressions are dp or the group size, no double division.
  if (sp > 1 && (near(dp * double(sp) * sp) || near(double(g) * sp) || near(double(g) * g / (double(sp) * sp)))) {
    return DivisorRule::kDividedTwice;
  }
  if (near(sp)) return DivisorRule::kSpOnly;
  if (c.gas() > 1 && near(double(g) * c.gas())) return DivisorRule::kAlsoGas;
  return DivisorRule::kUnmatched;
}

// The expression the matched rule names ("" for kUnmatched).
std::string ExpressionOf(DivisorRule rule, const MeasuredDivisor& m, const pb::Config& c, const NearDivisor& near) {
  const double g = m.group_size, sp = DegreesOf(c).sp;
  switch (rule) {
    case DivisorRule::kPartialSumsAdded:
    case DivisorRule::kCopiesAdded:
    case DivisorRule::kSum:
      return "1";
    case DivisorRule::kPartialSumsAveraged:
    case DivisorRule::kGroupMean:
      return "group size";
    case DivisorRule::kExpertsByDp:
      return near(g) ? "group size" : "dp";
    case DivisorRule::kExpertsOverEdp:
      return "edp group size";
    case DivisorRule::kShardOnly:
      return "group size / replicate";
    case DivisorRule::kDpOnlyOverSp:
    case DivisorRule::kDpOnlyOverCp:
      return "dp";
    case DivisorRule::kDividedTwice:
      return near(g * g / (sp * sp)) ? "(group size / sp)^2" : "group size x sp";
    case DivisorRule::kSpOnly:
      return "sp";
    case DivisorRule::kAlsoGas:
      return "group size x gas";
    case DivisorRule::kUnmatched:
      break;
  }
  return "";
}

// The parallel dimension the matched rule follows; a divisor that is right follows none, except where the
// rule names the dimension whatever the expected divisor.
Dimension DimensionOf(DivisorRule rule, const MeasuredDivisor& m, const pb::Config& c, bool right) {
  const auto deg = DegreesOf(c);
  const Dimension none = Dimension::kNone;
  switch (rule) {
    case DivisorRule::kPartialSumsAveraged:
    case DivisorRule::kCopiesAdded:
      return m.group == "tp" ? Dimension::kTp : none;  // the model-parallel group's dimension
    case DivisorRule::kExpertsOverEdp:
      return Dimension::kEp;
    case DivisorRule::kGroupMean:
      return !right && (deg.sp > 1 || deg.cp > 1) ? (deg.sp > 1 ? Dimension::kSp : Dimension::kCp) : none;
    case DivisorRule::kShardOnly:
      return right ? none : Dimension::kReplicate;
    case DivisorRule::kDpOnlyOverSp:
      return right ? none : Dimension::kSp;
    case DivisorRule::kDpOnlyOverCp:
      return right ? none : Dimension::kCp;
    case DivisorRule::kSum:
      return Dimension::kWorld;
    case DivisorRule::kDividedTwice:
      return Dimension::kDp;
    case DivisorRule::kSpOnly:
      return Dimension::kSp;
    case DivisorRule::kAlsoGas:
      return Dimension::kGas;
    default:
      return none;
  }
}

// The cause of the matched rule: none when the divisor is right (a double division whatever it is), else a
// reduction divisor, or unexplained when no rule names it.
Cause CauseOf(DivisorRule rule, bool right) {
  if (rule == DivisorRule::kDividedTwice) return Cause::kDoubleDivision;
  if (right) return Cause::kNone;
  return rule == DivisorRule::kUnmatched ? Cause::kUnexplained : Cause::kReductionDivisor;
}

// The DeepSpeed change behind the matched rule, for a DeepSpeed run.
std::optional<DeepSpeedChange> ChangeOf(DivisorRule rule, bool deepspeed) {
  if (!deepspeed) return std::nullopt;
  if (rule == DivisorRule::kExpertsOverEdp) return DeepSpeedChange::kPrs5259And6546;
  if (rule == DivisorRule::kDpOnlyOverSp) return DeepSpeedChange::kPr4530;
  if (rule == DivisorRule::kDividedTwice) return DeepSpeedChange::kPr4957;
  return std::nullopt;
}

}  // namespace

DivisorFinding ExplainDivisor(const MeasuredDivisor& m, const pb::Config& c, bool deepspeed, double ctol) {
  const NearDivisor near{m.divisor, ctol};
  DivisorFinding f;
  f.right = m.expected > 0 && near(m.expected);
  f.rule = MatchRule(m, c, near, f.right);
  f.cause = CauseOf(f.rule, f.right);
  f.expression = ExpressionOf(f.rule, m, c, near);
  f.dimension = DimensionOf(f.rule, m, c, f.right);
  f.change = ChangeOf(f.rule, deepspeed);
  f.multiple = m.expected / m.divisor;
  f.with_replicas = SumsOverReplicas(c, m.group);
  return f;
}

Cause InconsistentReductionCause(const pb::Config& c) {
  return LossyCompression(c.comm_hook()) ? Cause::kLossyCompression : Cause::kUnexplained;
}

bool SumsOverReplicas(const pb::Config& c, const std::string& group) {
  return DegreesOf(c).replicate > 1 && group != "replicate";
}

}  // namespace gradtrace::semantics
