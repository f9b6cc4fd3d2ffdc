"""What every zoo run shares: the tiny attention LM and its data (reused from
tests/python/adapter_runs.py, so the zoo and the adapter tests train the same model), a tiny
mixture-of-experts LM, the autograd collectives that split rows over an expert-parallel group,
and the capture call with an explicit layout (a scenario runs on a prefix of the launched ranks,
so its trace set must say its own world, not the launch's)."""

import pathlib
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parents[1] / "python"))
from adapter_runs import BATCH, HIDDEN, IGNORE, SEQ, VOCAB, GatherSeq, TinyLM, batch, ce_sum  # noqa: E402,F401

EXPERTS = 4
# gradtrace.attach's mode for every capture() of this process: "full" (the zoo's traces), or with the live guard
# ("full+guard", "stats+guard", "guard"); launch.py sets it from --mode before any scenario runs
MODE = "full"


def make_lm():
    torch.manual_seed(1234)
    return TinyLM()


class MoELM(torch.nn.Module):
    """Embedding, a top-1 mixture-of-experts MLP (a router and EXPERTS linear experts, all held by
    every rank so that every rank's parameter table is the same; a rank computes only its
    ``local`` experts), LayerNorm, head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.router = torch.nn.Linear(HIDDEN, EXPERTS, bias=False)
        self.experts = torch.nn.ModuleList(torch.nn.Linear(HIDDEN, HIDDEN) for _ in range(EXPERTS))
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens, ep_group=None):
        x = self.embed(tokens).reshape(-1, HIDDEN)
        probs = torch.softmax(self.router(x), dim=-1)
        choice = probs.argmax(dim=-1)
        gate = probs.gather(1, choice[:, None])
        if ep_group is None:  # every expert here
            rows, chosen, local = x, choice, range(EXPERTS)
        else:  # expert parallel: this rank's experts see the rows of every rank of the ep group
            n, r = dist.get_world_size(ep_group), dist.get_rank(ep_group)
            rows = GatherRows.apply(x, ep_group)
            parts = [torch.empty_like(choice) for _ in range(n)]
            dist.all_gather(parts, choice, group=ep_group)
            chosen = torch.cat(parts)
            per = EXPERTS // n
            local = range(r * per, (r + 1) * per)
        out = torch.zeros_like(rows)
        for e in local:
            mask = chosen == e
            out = out.index_put((mask.nonzero()[:, 0],), self.experts[e](rows[mask]))
        if ep_group is not None:
            out = ScatterRows.apply(out, ep_group)
        x = self.norm(x + gate * out)
        return self.head(x).reshape(*tokens.shape, VOCAB)


def make_moe():
    torch.manual_seed(4321)
    return MoELM()


class GatherRows(torch.autograd.Function):
    """All-gather along dim 0 over ``group``; backward sums the gradient over the group and keeps
    this rank's rows (an all-to-all dispatch, written with the collectives gloo has)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        return grad.chunk(dist.get_world_size(ctx.group))[dist.get_rank(ctx.group)], None


class ScatterRows(torch.autograd.Function):
    """The combine after the experts: sum the partial outputs over ``group`` and keep this rank's
    rows; backward all-gathers the rows' gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.contiguous()
        dist.all_reduce(x, group=group)
        return x.chunk(dist.get_world_size(group))[dist.get_rank(group)].clone()

    @staticmethod
    def backward(ctx, grad):
        parts = [torch.empty_like(grad) for _ in range(dist.get_world_size(ctx.group))]
        dist.all_gather(parts, grad.contiguous(), group=ctx.group)
        return torch.cat(parts), None


def capture(model, out, rank, world, *, degrees, groups=None, rules=(), default_group="dp", gas=1, cp_kind="", loss="",
            loss_description="", config=None, optimizer=None, mode=None):
    """The manual adapter on this rank with the scenario's layout: ``world`` ranks 0..world-1 of the
    launch, ``groups`` name -> this rank's group as ranks, ``rules`` (regex, ParamInfo fields);
    ``mode``: gradtrace.attach's (default: MODE)."""
    import gradtrace
    from gradtrace.adapters.layout import Layout

    layout = Layout(world=world, rank=rank, degrees={"dp": 1, **degrees}, gas=gas, cp_kind=cp_kind,
                    groups={"world": list(range(world)), **(groups or {})}, default_group=default_group)
    for pattern, fields in rules:
        layout.add_rule(pattern, **fields)
    return gradtrace.attach(model, str(out), optimizer=optimizer, layout=layout, mode=mode or MODE,
                            run_id=f"zoo-{pathlib.Path(out).name}", loss=loss,
                            loss_description=loss_description, config=config or {})


def reduce_grads(params, group, divisor):
    """Sum each gradient over ``group`` (None: no collective) and divide it by ``divisor``."""
    for p in params:
        if p.grad is None:
            continue
        if group is not None:
            dist.all_reduce(p.grad, group=group)
        p.grad.div_(divisor)


def grad_norm(params):
    return torch.sqrt(sum(p.grad.double().pow(2).sum() for p in params if p.grad is not None))


def reduce_scatter_flat(cap, params, group, group_name, owner, shards, divisor, *, bucket_id=0, then=None):
    """A ZeRO/FSDP bucket: the parameters' gradients as one flat bucket, summed over ``group`` and
    divided by ``divisor``, of which this rank (``owner`` of ``shards``) keeps its contiguous part
    (gloo has no reduce-scatter: all-reduce, then keep). ``then(part)``: a further in-place
    reduction of the part (HSDP's all-reduce over the replicas). Records PRE_REDUCE (the whole
    bucket) and POST_REDUCE (the part, after ``then``); returns the FINAL pieces of the part."""
    rec = cap.recorder
    flat = torch.cat([p.grad.reshape(-1) for p in params])
    numel = flat.numel()
    pieces, off = [], 0
    for p in params:
        pieces.append((rec.param_id(p), 0, flat[off:off + p.numel()].clone()))
        off += p.numel()
    rec.write_bucket("PRE_REDUCE", pieces, group=group_name, bucket_id=bucket_id, bucket_numel=numel)
    if group is not None:
        dist.all_reduce(flat, group=group)
    flat.div_(divisor)
    lo, hi = owner * numel // shards, (owner + 1) * numel // shards
    if then is not None:
        then(flat[lo:hi])
    part, off = [], 0
    for p in params:
        a, b = max(lo, off), min(hi, off + p.numel())
        if a < b:
            part.append((rec.param_id(p), a - off, flat[a:b].clone()))
        off += p.numel()
    rec.write_bucket("POST_REDUCE", part, group=group_name, bucket_id=bucket_id, bucket_numel=numel,
                     partition_offset=lo, partition_count=hi - lo, divisor=divisor)
    return part
