#include "loss.h"

#include <ATen/ATen.h>

#include <map>

#include "data.h"
#include "ulysses.h"

namespace gradtrace::capture {

namespace {

// A rank's count summed over `g` (exact in fp64 for any token count).
int64_t SumOver(const NamedGroup& g, int64_t local, const at::Device& device) {
  at::Tensor t = at::full({1}, static_cast<double>(local), at::TensorOptions().dtype(at::kDouble)).to(device);
  AllReduceSum(g, t);
  return static_cast<int64_t>(t.item<double>());
}

}  // namespace

at::Tensor TokenLosses(const at::Tensor& logits, const at::Tensor& labels) {
  const int64_t V = logits.size(-1);
  at::Tensor l = logits;
  if (l.scalar_type() == at::kHalf || l.scalar_type() == at::kBFloat16) l = l.to(at::kFloat);
  at::Tensor per =
      at::cross_entropy_loss(l.reshape({-1, V}), labels.reshape({-1}), {}, at::Reduction::None, kIgnoreIndex);
  return per.view(labels.sizes());
}

LossResult ComputeLoss(const std::string& recipe, const at::Tensor& logits, const at::Tensor& labels,
                       const NamedGroup& sp, const NamedGroup& sdp, int dp, int gas) {
  LossResult r;
  const at::Tensor valid = labels != kIgnoreIndex;
  r.valid_local = valid.sum().item<int64_t>();
  r.valid_sequence = SumOver(sp, r.valid_local, logits.device());
  const int64_t sp_size = static_cast<int64_t>(sp.ranks.size());

  at::Tensor per = TokenLosses(logits, labels);
  at::Tensor loss;
  if (recipe == "local-mean" || recipe == "local-mean-div-sp") {
    loss = per.sum() / static_cast<double>(std::max<int64_t>(r.valid_local, 1));
    if (recipe == "local-mean-div-sp") loss = loss / static_cast<double>(sp_size);
  } else if (recipe == "token-weighted") {
    loss = per.sum() / static_cast<double>(std::max<int64_t>(r.valid_sequence, 1));
  } else if (recipe == "global-token-weighted") {
    const int64_t valid_global = SumOver(sdp, r.valid_local, logits.device());
    loss = per.sum() * static_cast<double>(dp) / static_cast<double>(std::max<int64_t>(valid_global, 1));
  } else if (recipe == "full-sequence") {
    // Every SP rank computes the same full-sequence mean from the gathered
    // per-token losses; backward hands each rank its own slice.
    at::Tensor all = GatherSequence(per, sp);
    at::Tensor all_valid = GatherSequenceNoGrad(valid.to(per.scalar_type()), sp);
    const double n = all_valid.sum().item<double>();
    loss = (all * all_valid).sum() / std::max(n, 1.0);
  } else {
    TORCH_CHECK(false, "unknown loss recipe ", recipe);
  }
  r.loss = loss / static_cast<double>(gas);
  return r;
}

at::Tensor ReferenceLoss(const at::Tensor& logits, const at::Tensor& labels, int dp, int gas) {
  at::Tensor per = TokenLosses(logits, labels);
  const at::Tensor valid = labels != kIgnoreIndex;
  const int64_t rows = labels.size(0) / dp;
  at::Tensor total;
  for (int d = 0; d < dp; ++d) {
    at::Tensor n = valid.narrow(0, d * rows, rows).sum().clamp_min(1);
    at::Tensor replica = per.narrow(0, d * rows, rows).sum() / n;
    total = d == 0 ? replica : total + replica;
  }
  return total / static_cast<double>(dp) / static_cast<double>(gas);
}

int ReferenceDp(const std::string& recipe, int dp) { return recipe == "global-token-weighted" ? 1 : dp; }

std::string LossDescription(const std::string& recipe) {
  static const std::map<std::string, std::string> kWords = {
      {"local-mean", "cross-entropy mean over this rank's own sub-sequence tokens, divided by gas"},
      {"local-mean-div-sp", "cross-entropy mean over this rank's own sub-sequence tokens, divided by sp and by gas"},
      {"token-weighted",
       "sum of this rank's token losses over the valid tokens of the whole sequences "
       "(all-reduced over sp), divided by gas"},
      {"global-token-weighted",
       "dp x sum of this rank's token losses over the valid tokens of the global batch "
       "(all-reduced over dp x sp), divided by gas"},
      {"full-sequence", "cross-entropy mean over the sp-gathered whole sequences, divided by gas"},
  };
  auto it = kWords.find(recipe);
  return it == kWords.end() ? recipe : it->second;
}

}  // namespace gradtrace::capture
