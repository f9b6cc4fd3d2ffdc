"""Runs the live guard meets in the wild, for test_guard.py: DDP over gloo, 2 CPU ranks, the tiny LM of
adapter_runs.py, SGD, 3 optimizer steps, gradtrace.attach(..., mode="guard").

    python guard_runs.py SCENARIO OUT [--on-violation warn|raise] [--guard-timeout S]

SCENARIO:
  clean      nothing wrong
  skip       rank 1 does not step its optimizer in step 1 (zero_grad with no step, as a GradScaler that found
             inf/NaN on that rank alone does)
  nan        rank 1's gradient of qkv.weight holds a NaN from step 2 on (its backward, before DDP's reduction)
  die-end    rank 1 dies (os._exit) after its last backward, before its last optimizer step: rank 0 ends its
             loop (DDP's last all-reduce is done) and closes its capture, the last step's exchange unanswered
  die-mid    rank 1 dies in the middle of step 1's forward; rank 0's next collective is DDP's
  error      the guard's measuring raises (an injected internal error) from step 1 on
  hostile    a hook that sums without dividing, and a parameter whose name holds terminal escapes, its gradient
             NaN on rank 1 from step 1 on
Each rank prints "RANK r DONE" when its training loop and cap.close() returned; the launcher waits for every
rank (a rank that dies does not stop the others, as it would under mp.start_processes) and prints
"EXIT r CODE" for each, exiting with rank 0's code.
"""

import argparse
import multiprocessing
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adapter_runs import BATCH, batch, ce_sum, free_port, make_model  # noqa: E402

STEPS = 3


def run_rank(rank, args):
    try:
        train(rank, args)
    except BaseException as e:  # what the rank died of, on one line for the test
        print(f"RANK {rank} RAISED {type(e).__name__}: {str(e)[:300]!r}", flush=True)
        sys.exit(1)


def train(rank, args):
    import gradtrace
    from torch.nn.parallel import DistributedDataParallel as DDP

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = make_model()
    hook = None
    if args.scenario == "hostile":
        model.register_parameter("evil\x1b[2J\x07name", torch.nn.Parameter(torch.ones(3)))

        def hook(state, bucket):  # sums over the ranks, forgets to divide
            return dist.all_reduce(bucket.buffer(), async_op=True).get_future().then(lambda f: f.value()[0])
    net = DDP(model)
    if args.scenario == "error":
        import gradtrace.guard.measure as measure

        original = measure.reductions

        def failing(rank_, payloads, records, *a):
            if min(p["step"] for p in payloads.values()) >= 1:
                raise RuntimeError("injected guard error")
            return original(rank_, payloads, records, *a)
        measure.reductions = failing
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    cap = gradtrace.attach(net, args.out, optimizer=opt, mode="guard", hook=hook, loss="local-mean",
                           on_violation=args.on_violation, guard_timeout=args.guard_timeout)
    if args.scenario in ("nan", "hostile") and rank == 1:
        first = 2 if args.scenario == "nan" else 1

        def poison(grad):
            return grad * float("nan") if cap.recorder.step >= first else grad
        target = model.qkv.weight if args.scenario == "nan" else model.get_parameter("evil\x1b[2J\x07name")
        target.register_hook(poison)
    for step in range(STEPS):
        tokens, labels = batch(step, ignore=False)
        rows = BATCH // 2
        t, y = tokens[rank * rows:(rank + 1) * rows], labels[rank * rows:(rank + 1) * rows]
        if args.scenario == "die-mid" and rank == 1 and step == 1:
            os._exit(3)
        logits = net(t)
        extra = model.get_parameter("evil\x1b[2J\x07name").square().sum() * 0.01 if args.scenario == "hostile" else 0
        loss = ce_sum(logits, y) / (y != -100).sum() + extra
        loss.backward()
        cap.record_step(loss, (y != -100).sum())
        if args.scenario == "die-end" and rank == 1 and step == STEPS - 1:
            os._exit(3)  # after the last all-reduce, before this rank's last step (and its exchange) ends
        if not (args.scenario == "skip" and rank == 1 and step == 1):
            opt.step()
        opt.zero_grad()
    cap.close()
    print(f"RANK {rank} DONE", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("scenario", choices=["clean", "skip", "nan", "die-end", "die-mid", "error", "hostile"])
    ap.add_argument("out")
    ap.add_argument("--on-violation", default="warn", choices=["warn", "raise"])
    ap.add_argument("--guard-timeout", type=float, default=600.0)
    args = ap.parse_args()
    args.port = free_port()
    ctx = multiprocessing.get_context("fork")
    ranks = [ctx.Process(target=run_rank, args=(r, args)) for r in range(2)]
    for p in ranks:
        p.start()
    for r, p in enumerate(ranks):
        p.join()
        print(f"EXIT {r} {p.exitcode}", flush=True)
    sys.exit(ranks[0].exitcode)


if __name__ == "__main__":
    main()
