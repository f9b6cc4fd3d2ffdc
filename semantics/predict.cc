#include "predict.h"

#include "degrees.h"
#include "loss_recipes.h"
#include "reduction_path.h"
#include "scaling_policy.h"

namespace gradtrace::semantics {

std::optional<Prediction> Predict(const pb::Config& c, pb::ParamKind kind, bool loss_divided_by_gas,
                                  int64_t param_numel) {
  const Degrees d = DegreesOf(c);
  const auto share = SplitShare(c.loss(), d.split());
  if (!share) return std::nullopt;
  auto policy = ResolvePolicy(c.scaling());
  if (!policy.ok()) return std::nullopt;
  const ZeroSettings zero = RecordedZeroSettings(c);
  BucketContext b;
  b.path = ChooseReductionPath(c.zero_stage(), zero, param_numel);
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
  b.reduce_scatter = zero.reduce_scatter;
  const BucketScaling s = PlanBucketScaling(*policy, b);
  Prediction p;
  p.applied = s.Divisor();
  // A loss weighted by the global batch's tokens needs its reductions to sum; every other recipe a mean over dp.
  p.needed = RanksSumToGlobalLoss(c.loss()) ? 1 : d.dp;
  p.loss_factor = *share * (loss_divided_by_gas ? 1 : d.gas);
  p.reduction_factor = p.needed / p.applied;
  p.multiple = p.loss_factor * p.reduction_factor;
  p.double_division = expert && policy->zero == ScalingRule::kDsPre4957 && b.path == ReductionPath::kZeroPartitioned &&
                      b.reduce_scatter;
  p.cite = s.cite;
  return p;
}

std::optional<double> PipelineMultiple(const pb::Config& c, bool loss_divided_by_n) {
  const int n = c.pp_microbatches();
  if (n <= 1) return 1.0;
  if (!c.has_pp_scale_grads()) return std::nullopt;
  return (c.pp_scale_grads() ? 1.0 / n : 1.0) * (loss_divided_by_n ? 1.0 : n);
}

}  // namespace gradtrace::semantics
