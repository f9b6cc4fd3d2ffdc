#include "expected_divisor.h"

#include <algorithm>

#include "degrees.h"
#include "loss_recipes.h"

namespace gradtrace::semantics {

double ExpectedDivisor(const pb::Config& c, pb::ParamKind kind, int group_size) {
  const Degrees d = DegreesOf(c);
  const int split = d.split();
  if (kind == pb::EXPERT) {
    // The dense divisor: dp data-parallel replicas, each a split sequence.
    const auto share = SplitShare(c.loss(), split);
    double divisor = d.dp * (share ? *share : split);
    // A group larger than the expert-data-parallel group also spans ranks that
    // hold the same expert and the same tokens (tp ranks under TP + MoE): each
    // adds a full copy, so those copies are divided out too.
    const int edp = c.edp() > 0 ? c.edp() : std::max(1, d.dp / std::max(1, c.ep_size()));
    const int base = edp * split;  // the split ranks hold different tokens: not copies
    if (group_size > base && group_size % base == 0) divisor *= group_size / base;
    return divisor;
  }
  if (SplitRanksSumToSequenceLoss(c.loss()) && group_size % split == 0) return group_size / double(split);
  return group_size;
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
