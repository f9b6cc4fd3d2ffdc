"""A tiny decoder-only transformer whose attention is DeepSpeed-Ulysses' DistributedAttention.

Pure torch, no downloads. Weights are a function of the seed alone (never of world size or rank),
so a single-rank reference and any sp x dp run start from the same model. Labels are passed
already shifted (label[t] = input_ids[t + 1]) and the model does not shift them again: shifting
inside the model would drop one target at every sub-sequence boundary under SP.
"""

import inspect
import math

import torch
import torch.nn.functional as F
from torch import nn


def local_causal_attention(q, k, v):
    """q, k, v: [batch, seq (full), heads (local), head_dim] -> same shape."""
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2), is_causal=True)
    return out.transpose(1, 2)


class Block(nn.Module):

    def __init__(self, hidden, heads, sp_group, moe_experts=0):
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(hidden)
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)
        self.ln2 = nn.LayerNorm(hidden)
        self.moe = None
        if moe_experts > 0:
            # deepspeed.moe.layer.MoE in place of the MLP: top-1 gating, no token dropping (infinite
            # capacity: the routing of a token does not depend on how many tokens a rank holds, so the
            # sp runs and the single-rank reference compute the same function), no random token
            # selection, expert-parallel size 1 (every rank holds every expert; the experts' gradients
            # are reduced over the expert-data-parallel group = all ranks).
            from deepspeed.moe.layer import MoE
            self.moe = MoE(hidden_size=hidden, expert=_MLP(hidden), num_experts=moe_experts, ep_size=1, k=1,
                           drop_tokens=False, use_rts=False)
        else:
            self.fc1 = nn.Linear(hidden, 4 * hidden)
            self.fc2 = nn.Linear(4 * hidden, hidden)
        self.attn = None
        if sp_group is not None:
            from deepspeed.sequence.layer import DistributedAttention
            # Batch-first layout [b, s/sp, h, d]: scatter heads (2), gather sequence (1).
            self.attn = DistributedAttention(local_causal_attention, sp_group, scatter_idx=2, gather_idx=1)
            # batch_dim_idx exists from 0.14.x on. Before it, DistributedAttention's all-to-all assumes a
            # sequence-first layout; with micro-batch 1 the batch-first tensors [1, s/sp, h, d] are laid
            # out identically, so the same call is exact there (the issue notes: micro-batch 1 before 0.14.5).
            self.attn_kwargs = {"batch_dim_idx": 0} if "batch_dim_idx" in inspect.signature(
                DistributedAttention.forward).parameters else {}

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, self.heads, h // self.heads).unbind(2)
        if self.attn is None:
            a = local_causal_attention(q, k, v)
        else:
            a = self.attn(q, k, v, **self.attn_kwargs)
        x = x + self.proj(a.reshape(b, s, h))
        if self.moe is not None:
            out, _l_aux, _counts = self.moe(self.ln2(x))  # the gate's auxiliary loss is not used
            return x + out
        return x + self.fc2(F.gelu(self.fc1(self.ln2(x))))


class _MLP(nn.Module):

    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class TinyLM(nn.Module):
    """forward(input_ids, labels, position_ids) -> per-token losses [b, s_local] (0 where ignored)
    and the valid-token mask; the loss recipe (loop.py) reduces them."""

    def __init__(self, vocab, hidden, heads, layers, max_seq, sp_group=None, moe_experts=0):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_seq, hidden)
        self.blocks = nn.ModuleList([Block(hidden, heads, sp_group, moe_experts) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)
        self.sp_group = sp_group
        self.recipe = "local-mean"  # set by the runner; see forward()
        self.sdp_group, self.dp = None, 1  # set by the runner for global-token-weighted

    def forward(self, input_ids, labels, position_ids):
        """This rank's loss, by recipe (gradtrace names):
        local-mean     mean CE over this rank's valid tokens (the #5248 loop; `loss / sp` is applied
                       by the caller, as in the issue)
        token-weighted sum of this rank's token CE / valid tokens of the whole sequences (count
                       all-reduced over the SP group): exact with uneven shards
        global-token-weighted  dp x sum of this rank's token CE / valid tokens of the global batch (count
                       all-reduced over the sequence-data-parallel group): exact for the global token
                       mean also when DP replicas hold unequal counts (DeepSpeed divides by dp)
        full-sequence  Megatron-DeepSpeed style: deepspeed.sequence.cross_entropy.
                       vocab_sequence_parallel_cross_entropy gathers the per-token losses of the
                       whole sequence (backward: this rank's slice), then the mean over all valid tokens
        """
        logits = self.logits(input_ids, position_ids).float()
        valid = labels != -100
        sp_active = self.sp_group is not None and torch.distributed.get_world_size(self.sp_group) > 1

        def valid_over(group):  # this rank's valid-token count, summed over `group` (None: this rank alone)
            n = valid.sum().to(torch.float32)
            if group is not None:
                torch.distributed.all_reduce(n, group=group)
            return n

        if self.recipe == "full-sequence" and sp_active:
            try:
                from deepspeed.sequence.cross_entropy import vocab_sequence_parallel_cross_entropy
            except ImportError:  # DeepSpeed < 0.15: the same function, as Megatron-DeepSpeed had it
                vocab_sequence_parallel_cross_entropy = _vocab_sequence_parallel_cross_entropy
            # [s/sp, b, V] and [s/sp, b] (sequence first, as Megatron); returns [s, b] for the whole sequence.
            token = vocab_sequence_parallel_cross_entropy(logits.transpose(0, 1).contiguous(),
                                                          labels.transpose(0, 1).contiguous(), self.sp_group)
            return token.sum() / valid_over(self.sp_group).clamp_min(1)
        # The other recipes: (scale x) the sum of this rank's token CE over a valid-token count.
        if self.recipe == "global-token-weighted":
            scale, n = self.dp, valid_over(self.sdp_group)
        elif self.recipe == "local-mean" or not sp_active:
            scale, n = 1, valid.sum()
        elif self.recipe == "token-weighted":
            scale, n = 1, valid_over(self.sp_group)
        else:
            raise ValueError(f"unknown loss recipe {self.recipe!r}")
        token = F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="none")
        return token.sum() * scale / n.clamp_min(1)

    def logits(self, input_ids, position_ids):
        x = self.tok(input_ids) + self.pos(position_ids)
        for blk in self.blocks:
            x = blk(x)
        return self.head(self.ln_f(x))


class _VocabSequenceParallelCrossEntropy(torch.autograd.Function):
    """For DeepSpeed releases without deepspeed/sequence/cross_entropy.py (added in 0.15): the same
    computation as that file and as Megatron-DeepSpeed's megatron/core/sequence_parallel/cross_entropy.py
    (vocab not split: per-token CE of the local sub-sequence, all-gathered over the SP group; backward:
    this rank's slice of the incoming gradient, through the softmax)."""

    @staticmethod
    def forward(ctx, logits, target, sp_group):
        # logits [s/sp, b, V] fp32, target [s/sp, b]
        ignore = target == -100
        tgt = target.masked_fill(ignore, 0)
        logp = torch.log_softmax(logits, dim=-1)
        loss = -logp.gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        loss = loss.masked_fill(ignore, 0.0)
        sp = torch.distributed.get_world_size(sp_group)
        rank = torch.distributed.get_rank(sp_group)
        parts = [torch.empty_like(loss) for _ in range(sp)]
        torch.distributed.all_gather(parts, loss.contiguous(), group=sp_group)
        ctx.save_for_backward(logp.exp(), tgt, ignore)
        ctx.rank, ctx.n = rank, loss.shape[0]
        return torch.cat(parts, dim=0)

    @staticmethod
    def backward(ctx, grad_out):
        softmax, tgt, ignore = ctx.saved_tensors
        g = grad_out[ctx.rank * ctx.n:(ctx.rank + 1) * ctx.n]
        grad = softmax.clone()
        grad.scatter_add_(-1, tgt.unsqueeze(-1), -torch.ones_like(tgt, dtype=grad.dtype).unsqueeze(-1))
        grad = grad * (g * (~ignore)).unsqueeze(-1)
        return grad, None, None


def _vocab_sequence_parallel_cross_entropy(logits, target, sp_group):
    return _VocabSequenceParallelCrossEntropy.apply(logits, target, sp_group)


def build_model(seed, vocab, hidden, heads, layers, max_seq, sp_group=None, moe_experts=0):
    """Deterministic weights: the same seed gives the same model on every rank and world size."""
    gen_state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    model = TinyLM(vocab, hidden, heads, layers, max_seq, sp_group, moe_experts)
    # Non-default init so that no gradient is accidentally tiny; still a function of the seed only.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() > 1:
                p.normal_(0.0, 1.0 / math.sqrt(p.shape[-1]))
    torch.random.set_rng_state(gen_state)
    return model


def make_batch(seed, step, global_batch, seq_len, vocab, ignore_frac):
    """The global batch of step `step`: input_ids, labels (shifted, -100 = ignored) [G, T].
    A function of (seed, step) only."""
    g = torch.Generator().manual_seed(seed * 1000003 + step)
    ids = torch.randint(0, vocab, (global_batch, seq_len + 1), generator=g)
    input_ids, labels = ids[:, :-1].clone(), ids[:, 1:].clone()
    if ignore_frac > 0:
        drop = torch.rand(global_batch, seq_len, generator=g) < ignore_frac
        labels[drop] = -100
    return input_ids, labels


# --- gradtrace-train's model, for trace-against-trace comparison with its emulation -------------------------


def load_gradtrace_init(path):
    """The file `gradtrace-train --export-init FILE` writes (torch::jit::pickle_save of a typed
    Dict[str, Tensor]): {"param/<name>": initial weight, "batch/<step>/<micro>/{input_ids,labels,
    position_ids}": global batch}. Loaded with weights_only=True; the one extra global allowed,
    torch.jit._pickle.restore_type_tag, only re-attaches the dict's TorchScript type annotation."""
    import torch.jit._pickle as jit_pickle
    if not hasattr(torch.serialization, "safe_globals"):
        # torch < 2.4 (the old releases' environments) cannot allow that one global; the file is the one
        # gradtrace-train just wrote next to it (repro.py), not a download.
        return dict(torch.load(path, map_location="cpu", weights_only=False))
    with torch.serialization.safe_globals([jit_pickle.restore_type_tag]):
        return dict(torch.load(path, map_location="cpu", weights_only=True))


def gradtrace_causal_attention(q, k, v):
    """capture/train/ulysses.cc CausalAttention, op for op: q, k, v [b, seq (full), heads (local), hd]."""
    qh, kh, vh = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    scores = torch.matmul(qh, kh.transpose(-2, -1)) / math.sqrt(q.shape[-1])
    t = q.shape[1]
    future = torch.ones(t, t, dtype=torch.bool, device=q.device).triu(1)
    p = torch.softmax(scores.masked_fill(future, float("-inf")), dim=-1)
    return torch.matmul(p, vh).transpose(1, 2)


class _GtAttention(nn.Module):

    def __init__(self, hidden, heads, sp_group):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(hidden, 3 * hidden)
        self.out = nn.Linear(hidden, hidden)
        self.dist = None
        if sp_group is not None:
            from deepspeed.sequence.layer import DistributedAttention
            self.dist = DistributedAttention(gradtrace_causal_attention, sp_group, scatter_idx=2, gather_idx=1)
            self.dist_kwargs = {"batch_dim_idx": 0} if "batch_dim_idx" in inspect.signature(
                DistributedAttention.forward).parameters else {}

    def forward(self, h):
        b, s, hidden = h.shape
        q, k, v = self.qkv(h).view(b, s, 3, self.heads, hidden // self.heads).unbind(2)
        a = gradtrace_causal_attention(q, k, v) if self.dist is None else self.dist(q, k, v, **self.dist_kwargs)
        return self.out(a.reshape(b, s, hidden))


class _GtMLP(nn.Module):

    def __init__(self, hidden):
        super().__init__()
        self.fc1 = nn.Linear(hidden, 4 * hidden)
        self.fc2 = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))  # exact (erf) GELU, as at::gelu


class _GtBlock(nn.Module):

    def __init__(self, hidden, heads, sp_group):
        super().__init__()
        self.ln1 = nn.LayerNorm(hidden)  # eps 1e-5, as at::layer_norm's default
        self.attn = _GtAttention(hidden, heads, sp_group)
        self.ln2 = nn.LayerNorm(hidden)
        self.mlp = _GtMLP(hidden)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class _GtEmbed(nn.Module):

    def __init__(self, vocab, hidden, max_seq):
        super().__init__()
        self.tok = nn.Embedding(vocab, hidden)
        self.pos = nn.Embedding(max_seq, hidden)


class GradtraceLM(nn.Module):
    """capture/train/model.cc's TransformerLM (dense) with its parameter names and order: embed.tok/pos,
    blocks.N.{ln1, attn.qkv, attn.out, ln2, mlp.fc1, mlp.fc2}, ln_f, lm_head (no bias); pre-LN,
    exact GELU, attention scaled by 1/sqrt(head_dim) with a causal mask, here wrapped in DeepSpeed's
    DistributedAttention. Weights come from the init file, not from a seed. forward() and the loss
    recipes are TinyLM's."""

    def __init__(self, vocab, hidden, heads, layers, max_seq, sp_group=None):
        super().__init__()
        self.embed = _GtEmbed(vocab, hidden, max_seq)
        self.blocks = nn.ModuleList([_GtBlock(hidden, heads, sp_group) for _ in range(layers)])
        self.ln_f = nn.LayerNorm(hidden)
        self.lm_head = nn.Linear(hidden, vocab, bias=False)
        self.sp_group = sp_group
        self.recipe = "local-mean"
        self.sdp_group, self.dp = None, 1

    forward = TinyLM.forward

    def logits(self, input_ids, position_ids):
        x = self.embed.tok(input_ids) + self.embed.pos(position_ids)
        for blk in self.blocks:
            x = blk(x)
        return self.lm_head(self.ln_f(x))


def build_gradtrace_model(init, vocab, hidden, heads, layers, max_seq, sp_group=None):
    """GradtraceLM with the initial weights of `init` (load_gradtrace_init); names and shapes must match."""
    model = GradtraceLM(vocab, hidden, heads, layers, max_seq, sp_group)
    weights = {k[len("param/"):]: v for k, v in init.items() if k.startswith("param/")}
    names = [n for n, _ in model.named_parameters()]
    if names != list(weights):
        raise ValueError(f"--init holds parameters {list(weights)}, the model has {names}: "
                         "export with the same --layers/--moe-experts")
    with torch.no_grad():
        for n, p in model.named_parameters():
            if tuple(weights[n].shape) != tuple(p.shape):
                raise ValueError(f"--init {n}: shape {tuple(weights[n].shape)}, model {tuple(p.shape)} "
                                 "(export with the same --vocab/--hidden/--seq-len)")
            p.copy_(weights[n])
    return model
