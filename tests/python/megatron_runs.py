"""Hand-written Megatron-style tensor parallelism with sequence parallelism (no DTensor), captured by
the manual adapter, for tests/python/test_megatron_self.py: one process per rank (gloo on 127.0.0.1,
CPU), the same weights and global batch as the single-rank reference, so a correct run's FINAL
gradients equal the reference's.

    python megatron_runs.py KIND OUT [--dp D] [--tp T] [--tp-reduce sum|avg|none] [--no-sp] [--no-rules]
                            [--dp-first] [--steps N]

The model (as the reference's nn.Module): embedding, norm, up (16 -> 26), ReLU, down (26 -> 16), a
residual, norm2, head. KIND:
- ref: one rank, the whole model, loss = mean CE over the batch (manual adapter, no process group).
- megatron: dp x tp ranks (rank = dp_rank * tp + tp_rank, Megatron's order: tp groups are
  consecutive ranks); each dp rank takes its rows of the batch. Megatron's layers with sequence
  parallelism, written out as plain tensors and autograd functions over the tp group:
  - embed: vocab-parallel (this rank's rows of the vocabulary; tokens outside them give 0), its output
    reduce-scattered along the sequence (forward: sum over tp, keep this rank's chunk; backward:
    all-gather);
  - norm, norm2: LayerNorms replicated on every tp rank, each applied to the rank's chunk of the
    sequence only, so each rank's gradient of them is a partial sum over its tokens;
  - up: column-parallel (this rank's rows of weight and bias), its input all-gathered along the
    sequence (backward: reduce-scatter);
  - down: row-parallel (this rank's columns of weight), its output reduce-scattered along the sequence;
    its bias added after that, on the sequence chunk (a partial-sum gradient like the norms');
  - head: vocab-parallel (this rank's rows), its input all-gathered along the sequence, the logits
    all-gathered along the vocabulary (backward: this rank's slice), so every tp rank computes the
    same loss: the mean CE over the dp rank's tokens (a global mean once dp averages).
  The shards are declared with attach(..., shards={...}); norm, norm2 and down.bias with
  rules=[(..., {"kind": "REPLICATED", "grad_group": "tp"})] (unless --no-rules: then they stay DENSE
  over dp, the adapter's default). After backward, as Megatron's finalize_model_grads does, the
  partial-sum gradients (norm, norm2, down.bias) are all-reduced (SUM) over tp inside
  cap.around("tp", ...), and every gradient is all-reduced over dp and divided by dp inside
  cap.around("dp", ...) (when dp > 1); tp first, or dp first with --dp-first (Megatron-core's own
  order: finish_grad_sync, then _allreduce_layernorm_grads).
--tp-reduce: what the tp reduction of norm, norm2 and down.bias does: sum (Megatron's, the default),
avg (a bug: it divides the partial sums by tp, 1/tp of their gradient), none (a bug under sequence
parallelism: each tp rank keeps its own tokens' share, so the replicas of FINAL disagree).
--no-sp: Megatron's tensor parallelism without sequence parallelism: every tp rank runs the norms and
the residual stream on the whole sequence (the embedding's and down's outputs all-reduced over tp,
up's and head's inputs copied to tp with an all-reduce in backward), so every tp rank computes the
whole gradient of norm, norm2 and down.bias: identical copies that need no tp reduction (run it with
--tp-reduce none; --tp-reduce sum is the bug of summing the copies, tp x their gradient).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

from adapter_runs import free_port, start_ranks  # one harness for every runs script

VOCAB, HIDDEN, FFN, BATCH, SEQ = 32, 16, 26, 4, 8
SP_PARAMS = ("norm.weight", "norm.bias", "down.bias", "norm2.weight", "norm2.bias")  # partial sums over tp


class MLP(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.up = torch.nn.Linear(HIDDEN, FFN)
        self.down = torch.nn.Linear(FFN, HIDDEN)
        self.norm2 = torch.nn.LayerNorm(HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        with torch.no_grad():  # norms whose gradients are not all alike
            for norm in (self.norm, self.norm2):
                norm.weight.uniform_(0.5, 1.5)
                norm.bias.uniform_(-0.5, 0.5)

    def forward(self, tokens):
        x = self.embed(tokens)
        h = self.norm(x)
        x = x + self.down(torch.relu(self.up(h)))
        return self.head(self.norm2(x))


def make_model():
    torch.manual_seed(1234)
    return MLP()


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def _gather(x, dim, group):
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=dim)


def _reduce_scatter(x, dim, group):
    """Sum over the group, this rank's chunk along ``dim`` (gloo has no reduce_scatter)."""
    x = x.contiguous().clone()
    dist.all_reduce(x, group=group)
    return x.chunk(dist.get_world_size(group), dim=dim)[dist.get_rank(group)].contiguous()


class GatherSeq(torch.autograd.Function):
    """Megatron's gather_from_sequence_parallel_region: all-gather along the sequence; backward
    reduce-scatters."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _gather(x, 1, group)

    @staticmethod
    def backward(ctx, grad):
        return _reduce_scatter(grad, 1, ctx.group), None


class ReduceScatterSeq(torch.autograd.Function):
    """Megatron's reduce_scatter_to_sequence_parallel_region: sum partial outputs over tp and keep this
    rank's chunk of the sequence; backward all-gathers."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _reduce_scatter(x, 1, group)

    @staticmethod
    def backward(ctx, grad):
        return _gather(grad, 1, ctx.group), None


class GatherVocab(torch.autograd.Function):
    """All-gather the vocab-parallel logits along the vocabulary; every tp rank then computes the same
    loss, so backward keeps this rank's slice of the (identical) gradient."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group, ctx.n = group, x.shape[-1]
        return _gather(x, -1, group)

    @staticmethod
    def backward(ctx, grad):
        r = dist.get_rank(ctx.group)
        return grad[..., r * ctx.n:(r + 1) * ctx.n].contiguous(), None


class AllReduceTP(torch.autograd.Function):
    """Megatron's reduce_from_tensor_model_parallel_region (g): all-reduce forward, identity backward."""

    @staticmethod
    def forward(ctx, x, group):
        x = x.contiguous().clone()
        dist.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad, None


class CopyToTP(torch.autograd.Function):
    """Megatron's copy_to_tensor_model_parallel_region (f): identity forward, all-reduce backward."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def split(n, parts, index, uneven=False):
    """(start, size) of part ``index`` of ``n`` in ``parts``; ``uneven``: the first part one larger and
    the last one smaller (26 over 2: 14 + 12)."""
    sizes = [n // parts] * parts
    if uneven and parts > 1:
        sizes[0] += 1
        sizes[-1] -= 1
    sizes[-1] += n - sum(sizes)
    return sum(sizes[:index]), sizes[index]


def megatron(model, tp_rank, tp, tp_group, sp=True):
    """Replaces the layers' parameters by this tp rank's shards and the forward by Megatron's TP (+ SP)
    one; returns attach()'s shards=."""
    f0, fn = split(FFN, tp, tp_rank, uneven=True)  # the vocabulary stays even: all_gather
    v0, vn = split(VOCAB, tp, tp_rank)
    with torch.no_grad():
        model.embed.weight = torch.nn.Parameter(model.embed.weight[v0:v0 + vn].clone())
        model.up.weight = torch.nn.Parameter(model.up.weight[f0:f0 + fn].clone())
        model.up.bias = torch.nn.Parameter(model.up.bias[f0:f0 + fn].clone())
        model.down.weight = torch.nn.Parameter(model.down.weight[:, f0:f0 + fn].clone())
        model.head.weight = torch.nn.Parameter(model.head.weight[v0:v0 + vn].clone())

    # Into the residual stream (this rank's tokens under SP, all of them without), and out of it.
    reduce = ReduceScatterSeq.apply if sp else AllReduceTP.apply
    gather = GatherSeq.apply if sp else CopyToTP.apply

    def forward(tokens):
        local = tokens - v0
        outside = (local < 0) | (local >= vn)
        e = model.embed(local.masked_fill(outside, 0)).masked_fill(outside.unsqueeze(-1), 0.0)
        x = reduce(e, tp_group)                                     # SP: [b, S/tp, H], this rank's tokens
        h = gather(model.norm(x), tp_group)                         # [b, S, H]
        part = torch.nn.functional.linear(torch.relu(model.up(h)), model.down.weight)
        x = x + reduce(part, tp_group) + model.down.bias
        y = gather(model.norm2(x), tp_group)                        # [b, S, H]
        return GatherVocab.apply(model.head(y), tp_group)           # [b, S, VOCAB]

    model.forward = forward
    return {"embed.weight": (0, v0, VOCAB), "up.weight": (0, f0, FFN), "up.bias": (0, f0, FFN),
            "down.weight": (1, f0, FFN), "head.weight": (0, v0, VOCAB)}


def run_rank(rank, args):
    import gradtrace

    dp, tp = (args.dp, args.tp) if args.kind == "megatron" else (1, 1)
    world = dp * tp
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = make_model()
    opts = dict(loss="local-mean", loss_description="mean CE over the dp rank's tokens (every tp rank the same)")
    rows = slice(None)
    if args.kind == "megatron":
        dp_rank, tp_rank = divmod(rank, tp)
        tp_group = dp_group = None
        for d in range(dp):  # every rank creates every group, in the same order
            g = dist.new_group(list(range(d * tp, (d + 1) * tp)))
            tp_group = g if d == dp_rank else tp_group
        for t in range(tp):
            g = dist.new_group(list(range(t, world, tp)))
            dp_group = g if t == tp_rank else dp_group
        shards = megatron(model, tp_rank, tp, tp_group, sp=not args.no_sp)
        rules = [] if args.no_rules else \
            [("^(norm|norm2)\\.|^down\\.bias$", {"kind": "REPLICATED", "grad_group": "tp"})]
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(model, args.out, optimizer=opt, groups={"tp": tp_group, "dp": dp_group},
                               shards=shards, rules=rules, **opts)
        rows = slice(dp_rank * BATCH // dp, (dp_rank + 1) * BATCH // dp)
    else:  # ref
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(model, args.out, optimizer=opt, **opts)
    named = dict(model.named_parameters())

    def reduce_tp():
        if args.tp_reduce == "none":
            return
        params = [named[n] for n in SP_PARAMS]
        with cap.around("tp", params, divisor=tp if args.tp_reduce == "avg" else 1):
            for p in params:
                dist.all_reduce(p.grad, group=tp_group)
                if args.tp_reduce == "avg":
                    p.grad.div_(tp)

    def reduce_dp():
        if dp == 1:
            return
        params = list(model.parameters())
        with cap.around("dp", params, divisor=dp):
            for p in params:
                dist.all_reduce(p.grad, group=dp_group)
                p.grad.div_(dp)

    for step in range(args.steps):
        tokens, labels = batch(step)
        tokens, labels = tokens[rows], labels[rows]
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))
        loss.backward()
        cap.record_step(loss, labels.numel())
        if args.kind == "megatron":
            for reduce in ((reduce_dp, reduce_tp) if args.dp_first else (reduce_tp, reduce_dp)):
                reduce()
        opt.step()
        opt.zero_grad()
    cap.close()
    if world > 1:
        dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["ref", "megatron"])
    ap.add_argument("out")
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--tp", type=int, default=2)
    ap.add_argument("--tp-reduce", choices=["sum", "avg", "none"], default="sum")
    ap.add_argument("--no-sp", action="store_true")
    ap.add_argument("--no-rules", action="store_true")
    ap.add_argument("--dp-first", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args(argv)
    args.port = free_port()
    world = args.dp * args.tp if args.kind == "megatron" else 1
    if world == 1:
        run_rank(0, args)
    else:
        start_ranks(run_rank, (args,), world)


if __name__ == "__main__":
    sys.exit(main())
