#include "scaling_policy.h"

#include "deepspeed_releases.h"

namespace gradtrace::semantics {

Expected<ScalingPolicy> ResolvePolicy(const std::string& name) {
  ScalingPolicy p;
  p.name = name;
  if (name == "sum") {
    p.engine = p.zero = ScalingRule::kSum;
    p.engine_cite = p.zero_cite = "no DeepSpeed counterpart: the raw sum over the group";
  } else if (name == "mean") {
    p.engine = p.zero = ScalingRule::kMean;
    p.engine_cite = FindDeepSpeedRelease("0.13.1")->engine_cite;
    p.zero_cite = "plain data-parallel mean: div_(world(dp group)), as before sequence parallelism";
  } else if (name == "ds-4530") {
    p.engine = p.zero = ScalingRule::kDs4530;
    p.engine_cite = FindDeepSpeedRelease("0.14.4")->engine_cite;
    p.zero_cite = FindDeepSpeedRelease("0.13.1")->zero_cite;
    p.models_deepspeed = true;
  } else if (name == "ds-pre-4957") {
    // The double division only ever existed on the ZeRO reduce-scatter path;
    // the engine path is ds-4530's.
    p.engine = ScalingRule::kDs4530;
    p.zero = ScalingRule::kDsPre4957;
    p.engine_cite = FindDeepSpeedRelease("0.14.4")->engine_cite;
    p.zero_cite = FindDeepSpeedRelease("0.12.6")->zero_cite;
    p.models_deepspeed = true;
  } else if (name.rfind("deepspeed@", 0) == 0) {
    std::string v = name.substr(10);
    if (!v.empty() && v[0] == 'v') v = v.substr(1);
    const DeepSpeedRelease* row = FindDeepSpeedRelease(v);
    if (row == nullptr) {
      std::string known;
      for (const auto& k : KnownDeepSpeedVersions()) known += (known.empty() ? "" : ", ") + k;
      return Status::InvalidArgument("--scaling " + name + ": no table entry for DeepSpeed " + v + " (known: " + known +
                                     ")");
    }
    p.engine = row->engine;
    p.zero = row->zero;
    p.engine_cite = row->engine_cite;
    p.zero_cite = row->zero_cite;
    p.engine_unmodelled = row->engine_unmodelled;
    p.zero3_reduce_scatter = row->zero3_reduce_scatter;
    p.zero3_allreduce = row->zero3_allreduce;
    p.zero3_cite = row->zero3_cite;
    if (p.zero3_cite.empty()) p.zero3_unmodelled = "stage3.py of DeepSpeed " + v + " has not been read";
    p.deepspeed_version = v;
    p.models_deepspeed = true;
    return p;
  } else {
    return Status::InvalidArgument("--scaling: unknown policy '" + name +
                                   "' (expected mean, sum, ds-4530, ds-pre-4957 or deepspeed@VERSION)");
  }
  // The named policies apply their ZeRO-1/2 rule on both stage-3 paths (no double division there).
  p.zero3_reduce_scatter = p.zero3_allreduce = p.zero == ScalingRule::kDsPre4957 ? ScalingRule::kDs4530 : p.zero;
  p.zero3_cite = "the ZeRO-1/2 rule on both stage-3 paths: " + p.zero_cite;
  return p;
}

double BucketScaling::Divisor() const {
  double d = 1;
  for (const auto* ops : {&pre, &post}) {
    for (const auto& op : *ops) d = op.divide ? d * op.value : d / op.value;
  }
  return d;
}

BucketScaling PlanBucketScaling(const ScalingPolicy& policy, const BucketContext& b) {
  BucketScaling s;
  const double f = b.predivide_factor;
  const int g = b.group_size;
  if (b.path == ReductionPath::kEngineAllreduce) {
    s.cite = policy.engine_cite;
    if (policy.engine == ScalingRule::kSum) return s;
    const double eff = RuleDivisor(policy.engine, g, b.sp);
    // engine.py allreduce_bucket: postscale_gradients() == !prescale_gradients.
    if (b.prescale) {
      s.pre.push_back({false, 1.0 / eff});
    } else {
      if (f != 1.0) s.pre.push_back({false, 1.0 / f});
      if (f != eff) s.post.push_back({false, f / eff});
    }
    return s;
  }
  if (b.path == ReductionPath::kZero3ReduceScatter || b.path == ReductionPath::kZero3Allreduce) {
    // Both divide the local bucket before the collective (coalesced_collectives.py:124,
    // stage3.py:1878); stage 3 refuses gradient_predivide_factor != 1 with reduce_scatter.
    s.cite = policy.zero3_cite;
    const ScalingRule rule =
        b.path == ReductionPath::kZero3ReduceScatter ? policy.zero3_reduce_scatter : policy.zero3_allreduce;
    if (rule != ScalingRule::kSum) s.pre.push_back({true, RuleDivisor(rule, g, b.sp)});
    return s;
  }
  s.cite = policy.zero_cite;
  if (policy.zero == ScalingRule::kSum) return s;
  const double eff = RuleDivisor(policy.zero, g, b.sp);
  if (!b.reduce_scatter) {
    // gradient_reduction_w_predivide: the postscale test compares the factor
    // with the full group size, not group/sp, so factor == group size skips
    // the post-multiply and leaves a divisor of `factor`.
    if (b.prescale) {
      s.pre.push_back({true, eff});
    } else {
      if (f != 1.0) s.pre.push_back({false, 1.0 / f});
      if (f != g) s.post.push_back({false, f / eff});
    }
    return s;
  }
  // average_tensor: one division per bucket (per parameter when the bucket
  // holds MoE parameters; same value, as experts are replicated here).
  // gradient_predivide_factor and prescale_gradients do not reach this path.
  s.pre.push_back({true, eff});
  if (policy.zero == ScalingRule::kDsPre4957 && b.has_moe) s.pre.push_back({true, eff});
  return s;
}

}  // namespace gradtrace::semantics
