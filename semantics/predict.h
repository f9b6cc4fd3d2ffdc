// What a configuration's FINAL gradient is, as a multiple of the gradient of
// the mean loss, per parameter kind: the loss recipe's share over the divisor
// its scaling policy applies (scaling_policy.h, every deepspeed@X per stage and
// path). Replaces the diff's re-derivation from policy names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

#include "gradtrace.pb.h"

namespace gradtrace::semantics {

struct Prediction {
  double multiple = 1;          // FINAL / gradient of the mean loss = loss_factor x reduction_factor
  double loss_factor = 1;       // the recipe's share over a correct recipe's (split for local-mean, x gas if not / gas)
  double reduction_factor = 1;  // needed / applied
  double applied = 0;           // the divisor the policy applies to this kind's buckets
  double needed = 0;            // the divisor a correct recipe needs (ExpectedDivisor with a correct recipe)
  bool double_division = false;  // a ZeRO-1/2 MoE bucket divided twice (DeepSpeed before PR #4957)
  std::string cite;              // the file:line the applied arithmetic copies
};

// Empty when the recipe or the policy is unknown or the path not modelled.
// `loss_divided_by_gas`: every named recipe divides by gas. `param_numel`: the
// parameter's elements, which choose ZeRO-3's path (reduction_path.h: one above
// the recorded reduce_bucket_size is reduce-scattered whatever the settings);
// 0 when unknown: a parameter within a bucket.
std::optional<Prediction> Predict(const pb::Config& c, pb::ParamKind kind, bool loss_divided_by_gas = true,
                                  int64_t param_numel = 0);

// A pipeline schedule's share of FINAL over the mean-loss gradient, for a loss
// that is the mean over each micro-batch (the schedule's loss_fn, as
// torch.distributed.pipelining documents it): the schedule accumulates the n
// micro-batches' gradients and divides them by n when it scales gradients
// (scale_grads), so 1 with scaling and n without. `loss_divided_by_n`: the
// loss_fn also divides by n (then 1/n and 1). 1 for a run that is not
// pipelined; empty when the schedule's scaling is not recorded.
std::optional<double> PipelineMultiple(const pb::Config& c, bool loss_divided_by_n = false);

}  // namespace gradtrace::semantics
