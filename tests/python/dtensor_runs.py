"""Tensor-parallel runs on DTensor (torch.distributed.tensor.parallel) and hand-written Megatron-style
shards, captured by the one-call adapters, for tests/python/test_dtensor_capture.py: one process per
rank (gloo on 127.0.0.1, CPU), the same weights and global batch at every layout, so a correct run's
FINAL gradients equal the single-rank reference's.

    python dtensor_runs.py KIND WORLD OUT [--loss-scale S] [--steps N]

The model: embedding, norm, up (16 -> 26), ReLU, down (26 -> 16), norm2, head. Uneven shards: under
FSDP2 x TP each tp rank's 13 rows of up are split 7 + 6 over dp (torch.chunk's split, which DTensor's
Shard uses); the hand-written Megatron shards split 26 as 14 + 12. (parallelize_module itself needs
even tp shards on torch 2.15: RowwiseParallel's DTensor.from_local of an uneven ColwiseParallel output
infers the wrong global size, "a and b must have same reduction dim, but got [32, 24] X [25, 16]".)

KIND:
- ref: one rank, the whole model (manual adapter, no process group).
- tp: parallelize_module on a 1-D ("tp",) mesh of WORLD ranks: up ColwiseParallel (Shard(0) weight
  and bias), down RowwiseParallel (Shard(1) weight, Replicate bias); the rest plain tensors that every
  tp rank computes alike. manual_adapter.attach(model, out, optimizer=opt).
- tp-sp: Megatron-style TP + sequence parallel: embed RowwiseParallel(output Shard(1)), norm and
  norm2 SequenceParallel (Replicate weights whose gradients are Partial(sum) over tp), up Colwise
  (input Shard(1)), down Rowwise (output Shard(1)), head Colwise (output Replicate); manual adapter.
- fsdp-tp: the tp-sp plan on the "tp" dim of a (dp 2, tp WORLD/2) mesh, then fully_shard over "dp"
  (up, down, then the root); batch rows split over dp; fsdp2_adapter.attach(model, out, optimizer=opt).
- ddp-tp: the tp plan on the "tp" dim of a (dp 2, tp WORLD/2) mesh, then DistributedDataParallel over
  "dp" (device_mesh=mesh["dp"]: DDP swaps the DTensor parameters for their local tensors); batch rows
  split over dp; ddp_adapter.attach(model, out, optimizer=opt).
- megatron: hand-written column/row-parallel up/down over the world as plain tensors (this rank's
  rows of up, columns of down, split 14 + 12 on 2 ranks; all-reduces in forward/backward as
  Megatron's f and g), declared with manual_adapter.attach(..., shards={...}).
--loss-scale S multiplies the loss passed to backward (a bug: S = 2 gives gradients 2x the reference).
--unreduced-partial: FINAL writes a Partial gradient's local share as it is (gradtrace.adapters.dtensor.reduce_partial
replaced by the identity in this process): what recording ``grad.to_local()`` amounts to.
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

from adapter_runs import free_port, start_ranks  # one harness for every runs script

VOCAB, HIDDEN, FFN, BATCH, SEQ = 32, 16, 26, 4, 8


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
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

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


def tp_plan(sp: bool):
    from torch.distributed.tensor import Replicate, Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, SequenceParallel

    if not sp:
        return {"up": ColwiseParallel(), "down": RowwiseParallel()}
    return {"embed": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1)),
            "norm2": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate())}


class _CopyToTP(torch.autograd.Function):  # Megatron's f: identity forward, all-reduce backward
    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous()
        dist.all_reduce(grad)
        return grad


class _ReduceFromTP(torch.autograd.Function):  # Megatron's g: all-reduce forward, identity backward
    @staticmethod
    def forward(ctx, x):
        x = x.contiguous()
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


def megatron_shards(model, rank, world):
    """Replaces up/down by this rank's rows/columns and returns attach()'s shards=. Uneven on purpose:
    on 2 ranks, 14 + 12 rows."""
    sizes = [FFN // world] * world
    if world > 1:
        sizes[0] += 1
        sizes[-1] += FFN - sum(sizes)
    start, n = sum(sizes[:rank]), sizes[rank]
    with torch.no_grad():
        model.up.weight = torch.nn.Parameter(model.up.weight[start:start + n].clone())
        model.up.bias = torch.nn.Parameter(model.up.bias[start:start + n].clone())
        model.down.weight = torch.nn.Parameter(model.down.weight[:, start:start + n].clone())

    def forward(tokens):
        x = model.embed(tokens)
        h = _CopyToTP.apply(model.norm(x))
        part = torch.nn.functional.linear(torch.relu(model.up(h)), model.down.weight)
        x = x + _ReduceFromTP.apply(part) + model.down.bias
        return model.head(model.norm2(x))

    model.forward = forward
    return {"up.weight": (0, start, FFN), "up.bias": (0, start, FFN), model.down.weight: (1, start, FFN)}


def run_rank(rank, args):
    import gradtrace

    if args.unreduced_partial:
        import gradtrace.adapters.dtensor

        gradtrace.adapters.dtensor.reduce_partial = lambda grad: grad
    world = args.world
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    model = make_model()
    kind = args.kind
    rows = slice(None)
    opts = dict(loss="local-mean", loss_description="mean CE over the tokens the rank sees: the whole batch")
    if kind in ("tp", "tp-sp"):
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("tp",))
        parallelize_module(model, mesh, tp_plan(kind == "tp-sp"))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(model, args.out, optimizer=opt, **opts)
    elif kind == "fsdp-tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.fsdp import fully_shard
        from torch.distributed.tensor.parallel import parallelize_module

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan(True))
        for layer in (model.up, model.down):
            fully_shard(layer, mesh=mesh["dp"])
        fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(model, args.out, optimizer=opt, loss="local-mean",
                               loss_description="mean CE over the dp rank's tokens")
        dp_rank = mesh.get_local_rank("dp")
        rows = slice(dp_rank * BATCH // 2, (dp_rank + 1) * BATCH // 2)
    elif kind == "ddp-tp":
        from torch.distributed.device_mesh import init_device_mesh
        from torch.distributed.tensor.parallel import parallelize_module
        from torch.nn.parallel import DistributedDataParallel as DDP

        mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
        parallelize_module(model, mesh["tp"], tp_plan(False))
        model = DDP(model, device_mesh=mesh["dp"])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(model, args.out, optimizer=opt, loss="local-mean",
                               loss_description="mean CE over the dp rank's tokens")
        dp_rank = mesh.get_local_rank("dp")
        rows = slice(dp_rank * BATCH // 2, (dp_rank + 1) * BATCH // 2)
    elif kind == "megatron":
        shards = megatron_shards(model, rank, world)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(model, args.out, optimizer=opt, groups={"tp": None}, shards=shards,
                               **opts)
    else:  # ref
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(model, args.out, optimizer=opt, **opts)
    for step in range(args.steps):
        tokens, labels = batch(step)
        tokens, labels = tokens[rows], labels[rows]
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1)) * args.loss_scale
        loss.backward()
        cap.record_step(loss, labels.numel())
        opt.step()
        opt.zero_grad()
    cap.close()
    if world > 1:
        dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["ref", "tp", "tp-sp", "fsdp-tp", "ddp-tp", "megatron"])
    ap.add_argument("world", type=int)
    ap.add_argument("out")
    ap.add_argument("--loss-scale", type=float, default=1.0)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--unreduced-partial", action="store_true")
    args = ap.parse_args(argv)
    args.port = free_port()
    if args.world == 1:
        run_rank(0, args)
    else:
        start_ranks(run_rank, (args,), args.world)


if __name__ == "__main__":
    sys.exit(main())
