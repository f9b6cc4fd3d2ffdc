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
#pragma once

#include "gradtrace.pb.h"

namespace gradtrace::semantics {

double ExpectedDivisor(const pb::Config& c, pb::ParamKind kind, int group_size);

// How many copies of the same expert (same tokens) an expert reduction group of
// `group_size` ranks holds: group / (edp x split) when larger, else 1.
int ExpertCopies(const pb::Config& c, int group_size);

// "dense", "expert", "tp-shard", "replicated" ("" when not recorded).
const char* ParamKindName(pb::ParamKind kind);

}  // namespace gradtrace::semantics
