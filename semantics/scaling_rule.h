// How a reduction divides the sum over its group: the rules the scaling
// policies (scaling_policy.h) and the DeepSpeed release table
// (deepspeed_releases.h) are written in.
#pragma once

namespace gradtrace::semantics {

enum class ScalingRule {
  kSum,        // no division: the plain sum over the group
  kMean,       // divide by the group size
  kDs4530,     // divide by group size / sp (DeepSpeed PR #4530)
  kDsPre4957,  // kDs4530, plus the second division PR #4957 removed from
               // ZeRO-1/2 reduce-scatter buckets that hold MoE parameters
};

// The divisor `rule` applies to the sum over a group of `group_size` ranks
// (once; the MoE double division of kDsPre4957 is PlanBucketScaling's).
double RuleDivisor(ScalingRule rule, int group_size, int sp);

}  // namespace gradtrace::semantics
