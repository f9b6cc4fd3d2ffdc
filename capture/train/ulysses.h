// Ulysses sequence parallelism: the all-to-alls that move attention inputs
// from sequence-sharded to head-sharded layout and back, and the sequence
// all-gather of the full-sequence loss. Each is an autograd function whose
// backward runs the inverse collective, so gradients flow back to the rank
// that owns each token.
//
// Layouts (S = sp, Tl = T/S, nh heads of size hd):
//   sequence-sharded  [B, Tl, nh,   hd]   rank s holds tokens [s*Tl, (s+1)*Tl)
//   head-sharded      [B, T,  nh/S, hd]   rank s holds heads  [s*nh/S, (s+1)*nh/S)
#pragma once

#include <ATen/Tensor.h>

#include "process_groups.h"

namespace gradtrace::capture {

// sequence-sharded -> head-sharded; backward: HeadToSeq. Identity for sp = 1.
at::Tensor SeqToHead(const at::Tensor& x, const NamedGroup& sp);
// head-sharded -> sequence-sharded; backward: SeqToHead.
at::Tensor HeadToSeq(const at::Tensor& x, const NamedGroup& sp);

// Causal softmax attention over the full sequence, q/k/v [B, T, h, hd].
at::Tensor CausalAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v);

// Attention for sequence-sharded q/k/v [B, Tl, nh, hd]: all-to-all to heads,
// causal attention over all T tokens, all-to-all back. Checks nh % sp == 0.
at::Tensor UlyssesAttention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v, const NamedGroup& sp);

// [B, Tl] per rank -> [B, T] on every rank of the SP group (Megatron's
// sequence-parallel gather). Backward returns this rank's slice of the
// incoming gradient, unreduced: every rank computes the same loss from the
// gathered tensor, so each rank's slice already is the gradient it owns.
at::Tensor GatherSequence(const at::Tensor& x, const NamedGroup& sp);
// The same gather without autograd (labels, masks).
at::Tensor GatherSequenceNoGrad(const at::Tensor& x, const NamedGroup& sp);

}  // namespace gradtrace::capture
