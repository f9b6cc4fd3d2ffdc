"""A 2-rank gloo DDP run captured by gradtrace.ddp_adapter, for test_capture_errors.py (issue 20: capture
never takes training down): spawned ranks on 127.0.0.1, a small MLP in DistributedDataParallel, the
adapter with its default hook, STEPS optimizer steps, cap.close(), destroy_process_group() and a normal
return. Each rank saves its final parameters to PARAMS.rankR (torch.save), so that a run whose capture
failed can be compared with one whose capture did not.

    python capture_error_run.py OUT PARAMS [--steps N] [--on-error warn|raise] [--overwrite] [--no-capture]
                                [--run-id ID] [--rank1-out DIR]

--rank1-out: rank 1 writes its trace there instead of OUT (so that one rank's disk can fill while the
other's does not).

Prints "capture_error_run: rank exit codes [a, b]" and exits 0 only when both ranks exited 0. A rank
still running 60 s after the other failed is killed (a collective left waiting on a dead peer).
"""

import argparse
import datetime
import multiprocessing
import os
import socket
import sys

WORLD = 2


def rank_main(rank, port, args):
    import torch
    import torch.distributed as dist

    import gradtrace

    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD,
                            timeout=datetime.timedelta(seconds=60))
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 8)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    cap = None
    if not args.no_capture:
        out = args.rank1_out if rank == 1 and args.rank1_out else args.out
        cap = gradtrace.attach(net, out, optimizer=opt, run_id=args.run_id, loss="local-mean",
                               on_error=args.on_error, overwrite=args.overwrite)
    for step in range(args.steps):
        g = torch.Generator().manual_seed(100 * step + rank)
        x = torch.randn(4, 32, generator=g)
        loss = net(x).pow(2).mean()
        loss.backward()
        if cap is not None:
            cap.record_step(loss, 4)
        opt.step()
        opt.zero_grad()
    if cap is not None:
        cap.close()
    torch.save({k: v.detach().clone() for k, v in net.module.state_dict().items()}, f"{args.params}.rank{rank}")
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("params")
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--on-error", default="warn")
    ap.add_argument("--overwrite", action="store_true")
    ap.add_argument("--no-capture", action="store_true")
    ap.add_argument("--run-id", default="capture-error-run")
    ap.add_argument("--rank1-out", default=None)
    args = ap.parse_args(argv)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(rank, port, args)) for rank in range(WORLD)]
    for p in procs:
        p.start()
    # Wait for both; once one has failed, give the other 60 s before killing it.
    deadline = None
    import time

    while any(p.is_alive() for p in procs):
        if deadline is None and any(p.exitcode not in (None, 0) for p in procs):
            deadline = time.monotonic() + 60
        if deadline is not None and time.monotonic() > deadline:
            for p in procs:
                if p.is_alive():
                    p.kill()
        time.sleep(0.05)
    codes = [p.exitcode for p in procs]
    print(f"capture_error_run: rank exit codes {codes}", file=sys.stderr, flush=True)
    return 0 if not any(codes) else 1


if __name__ == "__main__":
    sys.exit(main())
