"""A user's DDP script, for test_clean_exit.py: 2 gloo ranks on 127.0.0.1 (spawned processes, as
torch.multiprocessing.spawn starts them), a tiny MLP in DistributedDataParallel, gradtrace.ddp_adapter
attached with its default hook, 2 optimizer steps, cap.close(), destroy_process_group(), and a
normal return: each rank's interpreter tears down as a plain script's does (no os._exit).

    python clean_exit_run.py OUT [--stall]

Exit status 0 when both ranks exited 0; a rank's exit code is printed otherwise (-6: SIGABRT, e.g.
"terminate called without an active exception" at teardown).

--stall makes the race the DDP adapter had systematic: each rank runs on one CPU and the process
group's threads (the ones init_process_group starts) at nice 19, so that after a collective wakes
the main thread, they run again only when it waits, as under heavy load. With the adapter's former
`fut.then(record)` every such launch aborted (15 of 15 measured); plain DDP without any comm hook and
without gradtrace aborted in 4 of 6 (torch's own gloo works, freed by gloo's thread).
"""

import multiprocessing
import os
import socket
import sys

WORLD = 2


def renice_threads_since(before):
    """The threads started since ``before`` (a set of thread ids) at nice 19."""
    for tid in set(os.listdir("/proc/self/task")) - before:
        os.setpriority(os.PRIO_PROCESS, int(tid), 19)


def rank_main(rank, port, out, stall):
    import torch
    import torch.distributed as dist

    import gradtrace

    if stall:
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
        before = set(os.listdir("/proc/self/task"))
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    if stall:
        renice_threads_since(before)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    net = torch.nn.parallel.DistributedDataParallel(
        torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2)))
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    cap = gradtrace.attach(net, out, optimizer=opt, run_id="clean-exit", loss="local-mean")
    for _ in range(2):
        loss = net(torch.full((2, 4), rank + 1.0)).pow(2).mean()
        loss.backward()
        cap.record_step(loss, 2)
        opt.step()
        opt.zero_grad()
    cap.close()
    dist.destroy_process_group()


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        sys.exit(__doc__)
    out, stall = argv[0], "--stall" in argv[1:]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=rank_main, args=(rank, port, out, stall)) for rank in range(WORLD)]
    for p in procs:
        p.start()
    for p in procs:
        p.join()
    codes = [p.exitcode for p in procs]
    if any(codes):
        print(f"clean_exit_run: rank exit codes {codes}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
