"""Real training runs captured by the PyTorch adapters, for the adapter tests: one process per rank
(gloo on 127.0.0.1, CPU), the same weights and global batch at every world size, so a correct run's
FINAL gradients equal the single-rank reference's.

    python adapter_runs.py KIND WORLD OUT [--bug] [--steps N] [--gas G] [--sync-micro-steps] [--norm local]
                           [--hook fp16|bf16|powersgd] [--seed S] [--data-from STEP] [--mp bf16|bf16-reduce]

KIND: ddp (DistributedDataParallel, batch split over dp), cp (hand-written context parallel:
each rank holds a contiguous half of the sequence, attention all-gathers K and V, loss = global
token mean via all-reduced counts, gradients all-reduced over the cp group, manual adapter), fsdp2
(fully_shard, batch split over dp), hsdp (fully_shard on a replicate 2 x shard WORLD/2 mesh, batch
split over all WORLD ranks). WORLD 1 with kind ref-dense/ref-seq is the reference
(manual adapter, no process group). --bug: ddp sums without dividing (a hook of the user's);
cp takes each rank's local token mean (the #5248 pattern). --sync-micro-steps (ddp): every micro-step's
forward and backward run outside no_sync, so DDP all-reduces each micro-step while .grad accumulates.
--norm local: the reported grad norm is each rank's norm of the gradient it holds, not reduced over
the ranks (fsdp2: its shards; the ms-swift #8341 logging pattern); default: clip_grad_norm_'s.
--global-tokens (ddp, fsdp2): each rank's loss is its summed token loss over the valid tokens of the whole
global batch (counted with an all-reduce; a quarter of the labels ignored, so the ranks' counts differ) and the
framework's division is switched off (DDP: a comm hook that sums, declared divisor 1; FSDP2:
set_gradient_divide_factor(1.0) on every fully_shard module, with set_force_sum_reduction_for_comms(True): gloo
has no PREMUL_SUM, the op the factor alone selects), declared loss="global-token-sum": exact against ref-seq.
--keep-division (fsdp2 --global-tokens): FSDP2's mean left on, the bug: 1/dp of the gradient.
"""

import argparse
import contextlib
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

VOCAB, HIDDEN, BATCH, SEQ, IGNORE = 32, 16, 4, 16, -100


class TinyLM(torch.nn.Module):
    """Embedding, one single-head attention layer over the (possibly gathered) sequence, a head."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.qkv = torch.nn.Linear(HIDDEN, 3 * HIDDEN)
        self.proj = torch.nn.Linear(HIDDEN, HIDDEN)
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.head = torch.nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens, gather=None):
        x = self.embed(tokens)
        q, k, v = self.qkv(x).chunk(3, dim=-1)
        if gather is not None:  # context parallel: keys and values of the whole sequence
            k, v = gather(k), gather(v)
        att = torch.softmax(q @ k.transpose(1, 2) / HIDDEN ** 0.5, dim=-1)
        x = self.norm(x + self.proj(att @ v))
        return self.head(x)


class GatherSeq(torch.autograd.Function):
    """All-gather along the sequence over the cp group; backward sums the gradient over the group
    and keeps this rank's part (gloo has no reduce-scatter for this)."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(parts, x.contiguous(), group=group)
        return torch.cat(parts, dim=1)

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad, group=ctx.group)
        n = dist.get_world_size(ctx.group)
        return grad.chunk(n, dim=1)[dist.get_rank(ctx.group)], None


def make_model(seed=1234):
    torch.manual_seed(seed)
    return TinyLM()


def batch(step, ignore, data_from=None):
    """The global batch of ``step``; with ``ignore`` a quarter of the labels are ignored (so the
    ranks' token counts differ), without it every rank's mean covers as many tokens. ``data_from``:
    from that step on, other data (another sampler seed)."""
    g = torch.Generator().manual_seed((1000 if data_from is not None and step >= data_from else 100) + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    labels = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    if ignore:
        labels[torch.rand(BATCH, SEQ, generator=g) < 0.25] = IGNORE
    return tokens, labels


def ce_sum(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1), ignore_index=IGNORE,
                                             reduction="sum")


def run_rank(rank, args):
    import gradtrace

    world = args.world
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = make_model(args.seed)
    kind = args.kind
    guarded = "guard" in args.mode

    def attach(*a, **k):
        extra = {"on_violation": args.on_violation} if guarded else {}
        if args.reference:
            extra["reference"] = args.reference
        return gradtrace.attach(*a, mode=args.mode, **extra, **k)
    if kind == "ddp":
        from torch.nn.parallel import DistributedDataParallel as DDP

        net = DDP(model)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        hook, hook_state = comm_hook(args.hook)
        if args.bug or args.global_tokens:
            def hook(state, bucket):  # sums over the ranks, forgets to divide
                return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])
        recipe = "global-token-sum" if args.global_tokens else "local-mean"
        cap = attach(net, args.out, optimizer=opt, hook=hook, hook_state=hook_state,
                               divisor=1 if args.global_tokens else None, gas=args.gas, loss=recipe,
                               loss_description="CE summed over the rank's tokens / the global batch's "
                               "valid tokens" if args.global_tokens else "mean CE over the rank's tokens")
    elif kind == "fsdp2":
        from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

        # --mp bf16: bf16 compute, fp32 reduction; bf16-reduce: both bf16
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                  reduce_dtype=torch.bfloat16 if args.mp == "bf16-reduce" else torch.float32) \
            if args.mp != "none" else MixedPrecisionPolicy()
        for layer in (model.qkv, model.proj):
            fully_shard(layer, mp_policy=mp)
        net = fully_shard(model, mp_policy=mp)
        if args.global_tokens and not args.keep_division:  # a loss over the global batch's tokens: every reduction sums
            from torch.distributed.fsdp import FSDPModule

            for m in net.modules():  # the factor is per fully_shard call
                if isinstance(m, FSDPModule):
                    m.set_gradient_divide_factor(1.0)
                    m.set_force_sum_reduction_for_comms(True)  # gloo has no PREMUL_SUM (torch 2.15)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        cap = attach(net, args.out, optimizer=opt, gas=args.gas,
                               loss="global-token-sum" if args.global_tokens else "local-mean",
                               loss_description="CE summed over the rank's tokens / the global batch's "
                               "valid tokens" if args.global_tokens else "mean CE over the rank's tokens")
    elif kind == "hsdp":  # FSDP2's hybrid sharding on a (replicate 2, shard world/2) mesh
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("replicate", "shard"))
        for layer in (model.qkv, model.proj):
            fully_shard(layer, mesh=mesh)
        net = fully_shard(model, mesh=mesh)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        cap = attach(net, args.out, optimizer=opt, gas=args.gas, loss="local-mean",
                               loss_description="mean CE over the rank's tokens")
    elif kind == "cp":
        net = model
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        cap = attach(net, args.out, optimizer=opt, groups={"cp": None},
                               cp_kind="all-gather", dp=1, loss="token-weighted",
                               loss_description="CE summed over the rank's tokens / all-reduced count",
                               config={"scaling": "sum"})
    else:  # ref-dense, ref-seq: one rank, the whole batch and sequence
        net = model
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        cap = attach(net, args.out, optimizer=opt, loss="global-token-weighted",
                               loss_description="mean CE over every token")
    for step in range(args.steps):
        tokens, labels = batch(step, ignore=kind in ("cp", "ref-seq") or args.global_tokens, data_from=args.data_from)
        for micro in range(args.gas):
            mb = slice(micro * BATCH // args.gas, (micro + 1) * BATCH // args.gas)
            t, y = tokens[mb], labels[mb]
            if kind in ("ddp", "fsdp2", "hsdp"):  # dp: this rank's rows
                rows = t.shape[0] // world
                t, y = t[rank * rows:(rank + 1) * rows], y[rank * rows:(rank + 1) * rows]
            if kind == "cp":  # cp: this rank's half of the sequence
                cols = SEQ // world
                t, y = t[:, rank * cols:(rank + 1) * cols], y[:, rank * cols:(rank + 1) * cols]
            # DDP skips the all-reduce (forward and backward) of all but the last micro-step, unless told not to.
            quiet = kind == "ddp" and micro < args.gas - 1 and not args.sync_micro_steps
            with net.no_sync() if quiet else contextlib.nullcontext():
                logits = net(t, gather=lambda x: GatherSeq.apply(x, None)) if kind == "cp" else net(t)
                count = (y != IGNORE).sum()
                local = count.clone()
                if (kind == "cp" and not args.bug) or args.global_tokens:
                    dist.all_reduce(count)
                loss = ce_sum(logits, y) / count / args.gas
                loss.backward()
            cap.record_step(loss, local)
        if kind == "cp":
            params = [p for p in net.parameters() if p.grad is not None]
            with cap.around("cp", params):
                for p in params:
                    dist.all_reduce(p.grad)
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), 1e9)
        if args.norm == "local":
            norm = local_grad_norm(net)
        cap.report_grad_norm(norm)
        opt.step()
        opt.zero_grad()
    cap.close()
    if world > 1:
        dist.destroy_process_group()


def comm_hook(name):
    """(hook, state) of one of torch's own DDP communication hooks, (None, None) for DDP's default:
    fp16/bf16 compression (buckets all-reduced in that dtype), PowerSGD (rank-1 approximation from
    its third iteration on; the first two are plain all-reduces)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook

    if name == "fp16":
        return default_hooks.fp16_compress_hook, None
    if name == "bf16":
        return default_hooks.bf16_compress_hook, None
    if name == "powersgd":
        state = powerSGD_hook.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                            min_compression_rate=1)
        return powerSGD_hook.powerSGD_hook, state
    return None, None


def local_grad_norm(net):
    """The norm of the gradient values this rank holds (a DTensor's local shard), not reduced."""
    total = 0.0
    for p in net.parameters():
        if p.grad is not None:
            g = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            total += float((g.detach().double() ** 2).sum())
    return total ** 0.5


def start_ranks(fn, args, nprocs):
    """Runs fn(rank, *args) in `nprocs` processes forked from this one and waits for all of them (an
    exception in one is raised here, as mp.spawn's). Forked, not spawned: each rank starts with this
    process's torch already imported instead of importing it again (about 3 CPU-s per rank; the
    4-rank pipeline run: 22 s -> 11 s wall, 38 -> 17 CPU-s, the same traces). The parent has done no
    torch work and started no thread before.

    A forked rank ends with os._exit, without the interpreter's teardown, where torch 2.15.0's own gloo
    teardown race remains: a comm hook chaining `.then(...)` (--bug, --hook: torch releases the Python
    callback on gloo's thread after completing the future DDP waits on) and collectives launched in
    backward (gloo's thread can free the work, whose saved thread-local state holds a Python object).
    When that thread gets to it only after the main thread reached interpreter teardown, taking the GIL
    ends the thread with pthread_exit and the rank aborts ("terminate called without an active
    exception"; measured with the old DDP adapter, which chained one more .then(): 1 in 10 and 1 in 18
    --bug runs). DDP with the adapter's default hook has none of it (python/README.md, DDP: clean
    exits): test_clean_exit.py launches a user's script with spawned ranks and their teardown."""
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="fork")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["ddp", "fsdp2", "hsdp", "cp", "ref-dense", "ref-seq"])
    ap.add_argument("world", type=int)
    ap.add_argument("out")
    ap.add_argument("--bug", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--gas", type=int, default=1)
    ap.add_argument("--sync-micro-steps", action="store_true")
    ap.add_argument("--norm", choices=["global", "local"], default="global")
    ap.add_argument("--mp", choices=["none", "bf16", "bf16-reduce"], default="none",
                    help="fsdp2: a MixedPrecisionPolicy")
    ap.add_argument("--seed", type=int, default=1234, help="the model's init seed")
    ap.add_argument("--global-tokens", action="store_true", help="ddp, fsdp2: loss over the global valid tokens, "
                    "the framework's division off (loss='global-token-sum')")
    ap.add_argument("--keep-division", action="store_true", help="fsdp2 --global-tokens: leave FSDP2's mean on (the bug)")
    ap.add_argument("--data-from", type=int, default=None, help="other data from this step on")
    ap.add_argument("--hook", choices=["default", "fp16", "bf16", "powersgd"], default="default",
                    help="ddp: one of torch's communication hooks")
    ap.add_argument("--mode", default="full", help="attach's mode, e.g. stats, guard, stats+guard")
    ap.add_argument("--on-violation", default="warn", choices=["warn", "raise"], help="the guard's on_violation")
    ap.add_argument("--reference", default=None, help="the guard's reference run (a trace directory)")
    args = ap.parse_args(argv)
    args.port = free_port()
    if args.world == 1:
        run_rank(0, args)
    else:
        start_ranks(run_rank, (args,), args.world)


if __name__ == "__main__":
    sys.exit(main())
