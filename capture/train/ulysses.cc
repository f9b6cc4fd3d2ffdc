#include "ulysses.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <limits>

namespace gradtrace::capture {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

void AllToAll(const NamedGroup& g, at::Tensor& out, at::Tensor& in) {
  std::vector<int64_t> splits;  // empty: equal splits along dim 0
  g.pg->all_to_all_single(out, in, splits, splits)->wait();
}

// [B, Tl, nh, hd] -> [B, S*Tl, nh/S, hd]
at::Tensor RawSeqToHead(const at::Tensor& x, const NamedGroup& g) {
  const int64_t S = static_cast<int64_t>(g.ranks.size());
  const int64_t B = x.size(0), Tl = x.size(1), nh = x.size(2), hd = x.size(3);
  TORCH_CHECK(nh % S == 0, "Ulysses: ", nh, " heads are not divisible by sp=", S);
  at::Tensor in = x.reshape({B, Tl, S, nh / S, hd}).permute({2, 0, 1, 3, 4}).contiguous();
  at::Tensor out = at::empty_like(in);
  AllToAll(g, out, in);
  // out[j] is source rank j's sequence chunk of our heads.
  return out.permute({1, 0, 2, 3, 4}).reshape({B, S * Tl, nh / S, hd});
}

// [B, T, nh/S, hd] -> [B, T/S, nh, hd]
at::Tensor RawHeadToSeq(const at::Tensor& y, const NamedGroup& g) {
  const int64_t S = static_cast<int64_t>(g.ranks.size());
  const int64_t B = y.size(0), T = y.size(1), nhl = y.size(2), hd = y.size(3);
  TORCH_CHECK(T % S == 0, "Ulysses: sequence length ", T, " is not divisible by sp=", S);
  const int64_t Tl = T / S;
  at::Tensor in = y.reshape({B, S, Tl, nhl, hd}).permute({1, 0, 2, 3, 4}).contiguous();
  at::Tensor out = at::empty_like(in);
  AllToAll(g, out, in);
  // out[j] is source rank j's head group for our sequence chunk.
  return out.permute({1, 2, 0, 3, 4}).reshape({B, Tl, S * nhl, hd});
}

at::Tensor RawGather(const at::Tensor& x, const NamedGroup& g) {
  const int64_t S = static_cast<int64_t>(g.ranks.size());
  at::Tensor in = x.contiguous();
  // all_gather_single concatenates along dim 0: [S*B, Tl, ...].
  std::vector<int64_t> shape(in.sizes().begin(), in.sizes().end());
  shape[0] *= S;
  at::Tensor out = at::empty(shape, in.options());
  g.pg->all_gather_single(out, in)->wait();
  // [S, B, Tl, ...] -> [B, S*Tl, ...]
  std::vector<int64_t> split{S};
  for (int64_t d : in.sizes()) split.push_back(d);
  std::vector<int64_t> perm{1, 0};
  for (int64_t d = 2; d < static_cast<int64_t>(split.size()); ++d) perm.push_back(d);
  std::vector<int64_t> final_shape{in.size(0), S * in.size(1)};
  for (int64_t d = 2; d < in.dim(); ++d) final_shape.push_back(in.size(d));
  return out.view(split).permute(perm).reshape(final_shape);
}

const NamedGroup& GroupOf(AutogradContext* ctx) {
  return *reinterpret_cast<const NamedGroup*>(ctx->saved_data["group"].toInt());
}

struct SeqToHeadFn : public torch::autograd::Function<SeqToHeadFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const NamedGroup* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return RawSeqToHead(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {RawHeadToSeq(grads[0], GroupOf(ctx)), at::Tensor()};
  }
};

struct HeadToSeqFn : public torch::autograd::Function<HeadToSeqFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const NamedGroup* g) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    return RawHeadToSeq(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return {RawSeqToHead(grads[0], GroupOf(ctx)), at::Tensor()};
  }
};

struct GatherSeqFn : public torch::autograd::Function<GatherSeqFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const NamedGroup* g, int64_t group_rank) {
    ctx->saved_data["group"] = reinterpret_cast<int64_t>(g);
    ctx->saved_data["tl"] = x.size(1);
    ctx->saved_data["rank"] = group_rank;
    return RawGather(x, *g);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const int64_t tl = ctx->saved_data["tl"].toInt();
    const int64_t r = ctx->saved_data["rank"].toInt();
    return {grads[0].narrow(1, r * tl, tl).contiguous(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor SeqToHead(const at::Tensor& x, const NamedGroup& sp) {
  if (sp.ranks.size() <= 1) return x;
  return SeqToHeadFn::apply(x, &sp);
}

at::Tensor HeadToSeq(const at::Tensor& x, const NamedGroup& sp) {
  if (sp.ranks.size() <= 1) return x;
  return HeadToSeqFn::apply(x, &sp);
}

at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
  const int64_t T = q.size(1), hd = q.size(3);
  at::Tensor qh = q.transpose(1, 2), kh = k.transpose(1, 2), vh = v.transpose(1, 2);  // [B, h, T, hd]
  at::Tensor scores = at::matmul(qh, kh.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  at::Tensor future = at::ones({T, T}, q.options().dtype(at::kBool)).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  at::Tensor p = at::softmax(scores, -1);
  return at::matmul(p, vh).transpose(1, 2);  // [B, T, h, hd]
}

at::Tensor UlyssesAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const NamedGroup& sp) {
  const int64_t S = static_cast<int64_t>(sp.ranks.size());
  TORCH_CHECK(q.size(2) % S == 0, "Ulysses: ", q.size(2), " heads are not divisible by sp=", S);
  at::Tensor out = CausalAttention(SeqToHead(q, sp), SeqToHead(k, sp), SeqToHead(v, sp));
  return HeadToSeq(out, sp);
}

at::Tensor GatherSequence(const at::Tensor& x, const NamedGroup& sp) {
  if (sp.ranks.size() <= 1) return x;
  // The group rank is the position of this process in sp.ranks; the SP group
  // is built so that it equals topo.sp_rank(), which the pg also knows.
  return GatherSeqFn::apply(x, &sp, static_cast<int64_t>(sp.pg->getRank()));
}

at::Tensor GatherSequenceNoGrad(const at::Tensor& x, const NamedGroup& sp) {
  if (sp.ranks.size() <= 1) return x;
  return RawGather(x, sp);
}

}  // namespace gradtrace::capture
