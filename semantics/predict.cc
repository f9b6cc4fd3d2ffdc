#include "predict.h"

#include "degrees.h"
#include "loss_recipes.h"
#include "scaling_policy.h"

namespace gradtrace::semantics {

namespace {

// The path DeepSpeed (and gradtrace-train's emulation) takes for this stage.
ReductionPath PathOf(const pb::Config& c) {
  const bool reduce_scatter = c.extra().count("reduce_scatter") == 0 || c.extra().at("reduce_scatter") != "false";
  if (c.zero_stage() == 0) return ReductionPath::kEngineAllreduce;
  if (c.zero_stage() == 3) return reduce_scatter ? ReductionPath::kZero3ReduceScatter : ReductionPath::kZero3Allreduce;
  return ReductionPath::kZeroPartitioned;
}

}  // namespace

std::optional<Prediction> Predict(const pb::Config& c, pb::ParamKind kind, bool loss_divided_by_gas) {
  const Degrees d = DegreesOf(c);
  const auto share = SplitShare(c.loss(), d.split());
  if (!share) return std::nullopt;
  auto policy = ResolvePolicy(c.scaling());
  if (!policy.ok()) return std::nullopt;
  BucketContext b;
  b.path = PathOf(c);
  if (b.path == ReductionPath::kEngineAllreduce && d.sp > 1 && !policy->engine_unmodelled.empty()) return std::nullopt;
  if ((b.path == ReductionPath::kZero3ReduceScatter || b.path == ReductionPath::kZero3Allreduce) &&
      !policy->zero3_unmodelled.empty()) {
    return std::nullopt;
  }
  const bool expert = kind == pb::EXPERT;
  // Dense buckets reduce over dp x sp x cp; expert buckets over their edp group.
  b.group_size = expert ? d.edp : d.dp * d.split();
  b.sp = d.sp;
  b.has_moe = expert;
  b.predivide_factor = c.gradient_predivide_factor() > 0 ? c.gradient_predivide_factor() : 1.0;
  b.prescale = c.prescale_gradients();
  b.reduce_scatter = c.extra().count("reduce_scatter") == 0 || c.extra().at("reduce_scatter") != "false";
  const BucketScaling s = PlanBucketScaling(*policy, b);
  Prediction p;
  p.applied = s.Divisor();
  p.needed = d.dp;
  p.loss_factor = *share * (loss_divided_by_gas ? 1 : d.gas);
  p.reduction_factor = p.needed / p.applied;
  p.multiple = p.loss_factor * p.reduction_factor;
  p.double_division = expert && policy->zero == ScalingRule::kDsPre4957 && b.path == ReductionPath::kZeroPartitioned &&
                      b.reduce_scatter;
  p.cite = s.cite;
  return p;
}

}  // namespace gradtrace::semantics
