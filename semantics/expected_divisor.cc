#include "expected_divisor.h"

#include "degrees.h"
#include "loss_recipes.h"

namespace gradtrace::semantics {

double ExpectedDivisor(const pb::Config& c, pb::ParamKind kind, int group_size) {
  const Degrees d = DegreesOf(c);
  const int split = d.split();
  if (kind == pb::EXPERT) {
    // The dense divisor: dp data-parallel replicas, each a split sequence.
    const auto share = SplitShare(c.loss(), split);
    return d.dp * (share ? *share : split);
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
