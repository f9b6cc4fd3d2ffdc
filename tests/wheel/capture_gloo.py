#!/usr/bin/env python3
"""A small real capture with the installed wheel: 2 gloo ranks on 127.0.0.1 train one step of a tiny
MLP on different data and record PRE_REDUCE (local gradient), POST_REDUCE and FINAL (the all-reduced
gradient) through gradtrace.TraceWriter into OUT/rank-0000N.gtrace.

    capture_gloo.py OUT --reduce mean|sum

`mean` divides the all-reduced sum by the world size (DDP's behaviour); `sum` does not, so the FINAL
gradients of a `sum` run are exactly 2x those of a `mean` run. tools/wheel-check diffs the two.
Only record() knows how gradients reach the trace: when gradtrace.adapters.ddp lands, replace its
body with the adapter's attach() and keep the rest.
"""

import argparse
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradtrace

WORLD = 2


def model():
    torch.manual_seed(0)  # same weights on every rank and in every run
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4))


def batch(rank):
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    return torch.randn(32, 8, generator=g), torch.randn(32, 4, generator=g)


def run_info(net, rank, reduce):
    params = [{"name": n, "shape": list(p.shape), "dtype": "fp32"} for n, p in net.named_parameters()]
    return {"producer": "tests/wheel/capture_gloo.py", "producer_version": f"torch {torch.__version__}",
            "run_id": f"wheel-check-{reduce}", "rank": rank, "dp_rank": rank, "host": socket.gethostname(),
            "config": {"world": WORLD, "dp": WORLD, "sp": 1, "dtype": "fp32", "backend": "gloo",
                       "scaling": reduce, "loss": "local-mean"},
            "groups": [{"name": "dp", "ranks": list(range(WORLD))}], "params": params}


def record(net, rank, reduce, out_dir, loss):
    """One step's gradients into OUT/rank-N.gtrace; all-reduces them like DDP (one bucket)."""
    grads = [p.grad for p in net.parameters()]
    with gradtrace.TraceWriter(os.path.join(out_dir, f"rank-{rank:05d}.gtrace"), run_info(net, rank, reduce)) as w:
        w.write_step({"step": 0, "loss": float(loss), "valid_tokens": 32})
        slices = lambda: [{"param_id": i, "values": g} for i, g in enumerate(grads)]  # noqa: E731
        w.write_bucket({"step": 0, "phase": "PRE_REDUCE", "group": "dp", "slices": slices()})
        for g in grads:
            dist.all_reduce(g)
            if reduce == "mean":
                g.div_(WORLD)
        divisor = WORLD if reduce == "mean" else 1
        w.write_bucket({"step": 0, "phase": "POST_REDUCE", "group": "dp", "divisor": divisor, "slices": slices()})
        w.write_bucket({"step": 0, "phase": "FINAL", "slices": slices()})


def rank_main(rank, port, reduce, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        net = model()
        x, y = batch(rank)
        loss = torch.nn.functional.mse_loss(net(x), y)
        loss.backward()
        record(net, rank, reduce, out_dir, loss.item())
        dist.barrier()
    finally:
        dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--reduce", choices=["mean", "sum"], required=True)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    mp.spawn(rank_main, args=(free_port(), args.reduce, args.out), nprocs=WORLD)
    print(f"capture_gloo: {WORLD} ranks ({args.reduce}) -> {args.out}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
