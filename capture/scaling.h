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
// No LibTorch here.
#pragma once

#include <string>
#include <vector>

#include "status.h"

namespace gradtrace::capture {

enum class ScalingRule {
  kSum,        // no division: the plain sum over the group
  kMean,       // divide by the group size
  kDs4530,     // divide by group size / sp (PR #4530)
  kDsPre4957,  // kDs4530, plus the second division PR #4957 removed from
               // ZeRO-1/2 reduce-scatter buckets that hold MoE parameters
};

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
};

// "mean", "sum", "ds-4530", "ds-pre-4957" or "deepspeed@X.Y.Z" for a version
// in the table (KnownDeepSpeedVersions()). Unknown names: InvalidArgument.
Expected<ScalingPolicy> ResolvePolicy(const std::string& name);
std::vector<std::string> KnownDeepSpeedVersions();

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

}  // namespace gradtrace::capture
