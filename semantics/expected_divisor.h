// The divisor a correct reduction needs, from the layout a trace records: the
// sum over the group divided by it is the gradient of the mean loss.
//   DENSE (and not recorded): reduced over dp x sp x cp; divide by
//     group / (sp x cp) for recipes whose split ranks add up to the sequence's
//     loss, by the group size for local-mean-like recipes (loss_recipes.h).
//   EXPERT: reduced over its expert-data-parallel group, but the tokens it saw
//     came from every dense data-parallel rank, so it needs the dense divisor
//     (dp x the recipe's split share), NOT the edp group size: dividing by edp
//     is the mistake DeepSpeed PRs #5259/#6546 fixed (ep x too large). A group
//     larger than edp also spans ranks holding the same expert and tokens (tp
//     under TP + MoE, Megatron-LM PR #7160): their copies are divided out too.
//   TP_SHARD: reduced over dp like dense; tp ranks hold different shards, so no
//     division by tp.
//   REPLICATED: every tp rank computes the same full gradient; reduced over dp
//     like dense, not divided by tp.
// Those are the data-parallel reductions. A reduction over a model-parallel
// group whose ranks hold partial sums of one gradient needs no division
// (ExpectedDivisorOver below).
#pragma once

#include <string>

#include "gradtrace.pb.h"

namespace gradtrace::semantics {

double ExpectedDivisor(const pb::Config& c, pb::ParamKind kind, int group_size);

// True when a reduction of `param` over the group named `group` runs over a
// model-parallel group: its ranks computed shares of the same loss's gradient
// from different parts of the work, so they hold partial sums of it, not
// data-parallel replicas. That is the tensor-parallel group "tp" for any
// parameter (a norm or a row-parallel bias replicated on every tp rank under
// Megatron-style sequence parallelism: each rank's share comes from its own
// tokens, and Megatron-LM's _allreduce_layernorm_grads sums them), and a
// REPLICATED parameter's own grad_group when that is not a data-parallel
// group (dp, sp, cp, sdp, dp_cp, edp, world, shard, replicate and DTensor's
// data-parallel mesh dim names): the model-parallel group it is replicated
// over (DTensor's Partial norms).
bool ModelParallelReduction(const pb::ParamInfo& param, const std::string& group);

// One reduction of a parameter as a trace records it.
struct ReductionOver {
  std::string group;              // the group's name (BucketRecord.group)
  int group_size = 0;             // ranks it spans
  bool identical_inputs = false;  // every member's PRE_REDUCE was the same values
};

// The divisor a correct reduction of `param` over `r` needs. Over a
// model-parallel group (ModelParallelReduction) partial sums need 1: their sum
// is the gradient; if the members' inputs are identical copies instead (each
// rank computed the whole gradient, so the reduction was not needed), only
// their mean keeps it: the group size. Every other reduction (data-parallel):
// ExpectedDivisor(c, param.kind(), r.group_size).
double ExpectedDivisorOver(const pb::Config& c, const pb::ParamInfo& param, const ReductionOver& r);

// How many copies of the same expert (same tokens) an expert reduction group of
// `group_size` ranks holds: group / (edp x split) when larger, else 1.
int ExpertCopies(const pb::Config& c, int group_size);

// "dense", "expert", "tp-shard", "replicated" ("" when not recorded).
const char* ParamKindName(pb::ParamKind kind);

}  // namespace gradtrace::semantics
