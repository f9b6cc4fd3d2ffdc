// Gradient scaling policies: how a bucket is scaled around its collective.
// Each policy reproduces a named DeepSpeed behaviour and cites the file and
// line, at a release tag, whose arithmetic it copies. DeepSpeed has two paths
// with separate histories, modelled separately:
//   engine  — ZeRO stage 0: DeepSpeedEngine.allreduce_bucket (engine.py)
//   zero    — ZeRO stage 1/2: DeepSpeedZeroOptimizer.average_tensor
//             (reduce_scatter=true) or gradient_reduction_w_predivide
//             (reduce_scatter=false), in runtime/zero/stage_1_and_2.py
//   zero3   — ZeRO stage 3, runtime/zero/stage3.py, two paths per bucket:
//             reduce-scatter (__avg_scatter_grads -> reduce_scatter_coalesced)
//             and all-reduce (__avg_scatter_contiguous_grads, taken only with
//             reduce_scatter=false for a bucket of <= reduce_bucket_size)
// No LibTorch here: capture plans its buckets with it, the diff predicts with it.
#pragma once

#include <string>
#include <vector>

#include "scaling_rule.h"
#include "status.h"

namespace gradtrace::semantics {

struct ScalingPolicy {
  std::string name;  // as given: "mean", "deepspeed@0.13.1", ...
  ScalingRule engine = ScalingRule::kMean;
  ScalingRule zero = ScalingRule::kMean;
  std::string engine_cite;  // "deepspeed/runtime/engine.py:2341,2343 @ v0.13.1: ..."
  std::string zero_cite;
  std::string engine_unmodelled;  // why stage 0 with sp > 1 is not modelled ("" if it is)
  ScalingRule zero3_reduce_scatter = ScalingRule::kMean;
  ScalingRule zero3_allreduce = ScalingRule::kMean;
  std::string zero3_cite;
  std::string zero3_unmodelled;  // why stage 3 is not modelled for this policy ("" if it is)
  // The DeepSpeed release modelled ("0.12.6"; "" for the named policies), and
  // whether the policy reproduces DeepSpeed arithmetic at all (deepspeed@X,
  // ds-4530, ds-pre-4957): explanations cite DeepSpeed history only then.
  std::string deepspeed_version;
  bool models_deepspeed = false;
};

// "mean", "sum", "ds-4530", "ds-pre-4957" or "deepspeed@X.Y.Z" for a version
// in the table (deepspeed_releases.h). Unknown names: InvalidArgument.
Expected<ScalingPolicy> ResolvePolicy(const std::string& name);

// x.div_(value) or x.mul_(value), in DeepSpeed's order and with its operation,
// so the rounding matches.
struct ScaleOp {
  bool divide = true;
  double value = 1;
};

enum class ReductionPath { kEngineAllreduce, kZeroPartitioned, kZero3ReduceScatter, kZero3Allreduce };

struct BucketContext {
  ReductionPath path = ReductionPath::kEngineAllreduce;
  int group_size = 1;
  int sp = 1;
  bool has_moe = false;  // the bucket holds at least one expert parameter
  double predivide_factor = 1.0;
  bool prescale = false;
  bool reduce_scatter = true;  // zero path only
};

struct BucketScaling {
  std::vector<ScaleOp> pre;   // applied to the local bucket before the collective
  std::vector<ScaleOp> post;  // applied to the result after it
  std::string cite;
  // sum over the group / result: what the diff's --self check expects.
  double Divisor() const;
};

BucketScaling PlanBucketScaling(const ScalingPolicy& policy, const BucketContext& bucket);

}  // namespace gradtrace::semantics
