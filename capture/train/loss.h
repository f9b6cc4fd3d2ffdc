// Loss recipes (DESIGN.md, "Capture semantics"). Each rank holds logits and
// labels for its chunk of the sequence; the recipes differ in what they
// divide the summed token losses by:
//   local-mean         sum(local) / n(local)                  the #5248 loop
//   local-mean-div-sp  sum(local) / n(local) / sp             the proposed fix
//   token-weighted     sum(local) / n(whole sequences)        n all-reduced over SP: exact with uneven shards
//   global-token-weighted  dp * sum(local) / n(global batch)  n all-reduced over SDP: exact for the global
//                          token mean when DP replicas hold unequal counts (DeepSpeed divides by dp)
//   full-sequence      mean over the SP-gathered token losses Megatron-DeepSpeed style; backward slices
// Every recipe is then scaled by 1/gas, as DeepSpeed scales the loss under
// gradient accumulation.
#pragma once

#include <ATen/Tensor.h>

#include <string>

#include "process_groups.h"

namespace gradtrace::capture {

struct LossResult {
  at::Tensor loss;             // scalar passed to backward (includes 1/gas)
  int64_t valid_local = 0;     // labels != -100 on this rank
  int64_t valid_sequence = 0;  // over the SP group (whole sequences of this DP replica)
};

// Per-token cross-entropy [rows, T] with 0 at ignored labels; computed in at
// least fp32.
at::Tensor TokenLosses(const at::Tensor& logits, const at::Tensor& labels);

// A rank with no valid token contributes 0 (local-mean would otherwise be
// 0/0 = NaN, as in PyTorch's cross_entropy).
LossResult ComputeLoss(const std::string& recipe, const at::Tensor& logits, const at::Tensor& labels,
                       const NamedGroup& sp, const NamedGroup& sdp, int dp, int gas);

// The single-process reference every configuration is compared against, for
// the global batch of one micro-step: the mean over DP replicas (row blocks
// of batch/dp rows) of each replica's token mean, divided by gas. With dp = 1
// or equal valid counts per replica this is the plain token mean of the batch;
// with unequal counts it is what DP averaging of per-replica exact losses
// computes, and so the right reference for dp > 1.
// global-token-weighted targets the plain token mean of the global batch: its
// reference is ReferenceLoss with dp = 1 (ReferenceDp).
at::Tensor ReferenceLoss(const at::Tensor& logits, const at::Tensor& labels, int dp, int gas);
int ReferenceDp(const std::string& recipe, int dp);

// The recipe in words, for the trace's Config.loss_description.
std::string LossDescription(const std::string& recipe);

}  // namespace gradtrace::capture
