#!/usr/bin/env python3
"""A small real capture with the installed wheel, the way a user captures their own DDP training:
2 gloo ranks on 127.0.0.1 train one step of a tiny MLP wrapped in DistributedDataParallel, on
different data, with gradtrace.ddp_adapter attached (PRE_REDUCE and POST_REDUCE from its comm hook,
FINAL at optimizer.step()) into OUT/rank-0000N.gtrace.

    capture_gloo.py OUT --reduce mean|sum

`mean` is DDP's own all-reduce (sum, then divide by the world size); `sum` passes a comm hook of the
user's that sums without dividing, so the FINAL gradients of a `sum` run are exactly 2x those of a
`mean` run. tools/wheel-check diffs the two.
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


def summing_hook(group, bucket):
    """A user's comm hook with the bug under test: all-reduce (sum) without dividing by the world."""
    return dist.all_reduce(bucket.buffer(), group=group, async_op=True).get_future().then(lambda f: f.value()[0])


def train_step(rank, reduce, out_dir):
    net = torch.nn.parallel.DistributedDataParallel(model())
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    hook = {} if reduce == "mean" else {"hook": summing_hook, "hook_state": dist.group.WORLD}
    cap = gradtrace.attach(net, out_dir, optimizer=opt, run_id=f"wheel-check-{reduce}",
                           loss="local-mean", **hook)
    x, y = batch(rank)
    loss = torch.nn.functional.mse_loss(net(x), y)
    loss.backward()
    cap.record_step(loss, 32)
    opt.step()  # FINAL is written before the update
    cap.close()


def rank_main(rank, port, reduce, out_dir):
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        train_step(rank, reduce, out_dir)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    if reduce == "sum":
        # Everything is written and closed: skip the interpreter's teardown. The summing hook chains
        # .then() on gloo's future, and torch 2.15.0 releases that Python callback on gloo's thread,
        # which aborts the rank when it happens after the main thread reached teardown ("terminate
        # called without an active exception"; tests/python/adapter_runs.py start_ranks). `mean`, the
        # adapter's default hook, leaves gloo's thread nothing to release and exits normally.
        sys.stderr.flush()
        os._exit(0)


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
