#include "expected_divisor.h"

#include <algorithm>
#include <iterator>

#include "degrees.h"
#include "loss_recipes.h"

namespace gradtrace::semantics {

int ExpertCopies(const pb::Config& c, int group_size) {
  const Degrees d = DegreesOf(c);
  const int edp = c.edp() > 0 ? c.edp() : std::max(1, d.dp / d.ep);
  const int base = edp * d.split();  // the split ranks hold different tokens: not copies
  return group_size > base && group_size % base == 0 ? group_size / base : 1;
}

double ExpectedDivisor(const pb::Config& c, pb::ParamKind kind, int group_size) {
  const Degrees d = DegreesOf(c);
  const int split = d.split();
  // A loss already weighted by the global batch's tokens: every reduction sums (copies of one expert excepted).
  if (RanksSumToGlobalLoss(c.loss())) return kind == pb::EXPERT ? ExpertCopies(c, group_size) : 1;
  if (kind == pb::EXPERT) {
    // The dense divisor: dp data-parallel replicas, each a split sequence.
    const auto share = SplitShare(c.loss(), split);
    // Copies of the same expert in the group (tp under TP + MoE) are divided out too.
    return d.dp * (share ? *share : split) * ExpertCopies(c, group_size);
  }
  if (SplitRanksSumToSequenceLoss(c.loss()) && group_size % split == 0) return group_size / double(split);
  return group_size;
}

bool ModelParallelReduction(const pb::ParamInfo& param, const std::string& group) {
  if (group == "tp") return true;
  static const char* const kDataParallel[] = {"dp",           "sp",    "cp",    "sdp",       "dp_cp",
                                              "edp",          "world", "shard", "replicate", "dp_shard",
                                              "dp_replicate", "fsdp",  "hsdp",  "ddp"};
  if (param.kind() != pb::REPLICATED || group.empty() || group != param.grad_group()) return false;
  return std::none_of(std::begin(kDataParallel), std::end(kDataParallel), [&](const char* n) { return group == n; });
}

double ExpectedDivisorOver(const pb::Config& c, const pb::ParamInfo& param, const ReductionOver& r) {
  if (ModelParallelReduction(param, r.group)) return r.identical_inputs ? r.group_size : 1;
  return ExpectedDivisor(c, param.kind(), r.group_size);
}

const char* ParamKindName(pb::ParamKind kind) {
  switch (kind) {
    case pb::DENSE:
      return "dense";
    case pb::EXPERT:
      return "expert";
    case pb::TP_SHARD:
      return "tp-shard";
    case pb::REPLICATED:
      return "replicated";
    default:
      return "";
  }
}

}  // namespace gradtrace::semantics
