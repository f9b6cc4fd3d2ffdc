"""One gloo launch of 4 CPU ranks that runs every zoo scenario in sequence, each on ranks
0..world-1 of the launch with its own subgroups, writing its trace set to OUT/<scenario>/
(one launch instead of one per run: starting torch four times dominates a run's cost).

    python tests/zoo/launch.py OUT [--mode MODE] [SCENARIO ...]

``--mode``: gradtrace.attach's mode for every capture (zoo_model.MODE; default "full"). With the live
guard ("full+guard", "stats+guard", "guard") the launch forks one process group per scenario world
(4, 2, 1 ranks: the guard's exchange group is every rank of the default group, so a scenario must
own its whole world, as a training does) and each rank's stderr during a scenario goes to
OUT/<scenario>/rank-NNNNN.stderr (the guard's lines, per run); the guard's log is
OUT/<scenario>/rank-NNNNN.guard.jsonl. The gradtrace-train rows (run_all.py) cannot run the guard.
"""

import argparse
import contextlib
import os
import pathlib
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, str(pathlib.Path(__file__).resolve().parent))
import gradtrace  # noqa: E402,F401 - imported once, before the fork, for every rank
import zoo_model  # noqa: E402
from runs import SCENARIOS  # noqa: E402

WORLD = 4
SUBGROUPS = [(0, 1), (2, 3), (0, 2), (1, 3)]  # every rank creates every group, in this order


class Ranks:
    """This rank's view of the launch: ``group(ranks)`` is the process group of those global ranks
    (None for one rank: nothing to reduce)."""

    def __init__(self, rank, world=WORLD):
        self.rank = rank
        self._groups = {tuple(range(world)): dist.group.WORLD}
        for ranks in SUBGROUPS:
            if max(ranks) < world:
                self._groups[ranks] = dist.new_group(list(ranks))

    def group(self, ranks):
        ranks = tuple(ranks)
        return None if len(ranks) == 1 else self._groups[ranks]


def guarded(mode: str) -> bool:
    return "guard" in mode.split("+")


@contextlib.contextmanager
def stderr_to(path):
    """This process's stderr (fd 2, so the guard's lines and C++'s too) into ``path`` meanwhile."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    with open(path, "w") as f:
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)


def run_rank(rank, out, port, names, mode="full", world=WORLD):
    start = time.perf_counter()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.set_num_threads(1)
    zoo_model.MODE = mode
    ranks = Ranks(rank, world)
    if rank == 0:
        print(f"zoo: {world} ranks up in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    for sc in SCENARIOS:
        if names and sc.name not in names:
            continue
        start = time.perf_counter()
        if rank < sc.world:
            run_dir = pathlib.Path(out) / sc.name
            if guarded(mode):
                with stderr_to(run_dir / f"rank-{rank:05d}.stderr"):
                    sc.run(ranks, run_dir)
            else:
                sc.run(ranks, run_dir)
        dist.barrier()
        if rank == 0:
            print(f"zoo: {sc.name} {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if not argv:
        sys.exit(__doc__)
    ap = argparse.ArgumentParser(prog="launch.py", description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("names", nargs="*", metavar="SCENARIO")
    ap.add_argument("--mode", default="full", help='gradtrace.attach mode of every capture (default "full"; '
                                                  'e.g. "full+guard")')
    args = ap.parse_intermixed_args(argv)  # OUT [--mode M] [SCENARIO ...], in any order
    out, names, mode = args.out, set(args.names), args.mode
    unknown = names - {sc.name for sc in SCENARIOS}
    if unknown:
        sys.exit(f"launch.py: unknown scenarios {sorted(unknown)}")
    from gradtrace.adapters.rank_recorder import split_mode

    try:
        split_mode(mode)
    except ValueError as e:
        sys.exit(f"launch.py: --mode: {e}")
    # fork: the ranks inherit the imported torch instead of importing it four more times
    if not guarded(mode):  # every scenario on a prefix of one 4-rank launch
        mp.start_processes(run_rank, args=(out, free_port(), names, mode), nprocs=WORLD, join=True,
                           start_method="fork")
        return
    # the guard: one process group per scenario world, each scenario's ranks its whole world
    for world in sorted({sc.world for sc in SCENARIOS if not names or sc.name in names}, reverse=True):
        wave = {sc.name for sc in SCENARIOS if sc.world == world and (not names or sc.name in names)}
        mp.start_processes(run_rank, args=(out, free_port(), wave, mode, world), nprocs=world, join=True,
                           start_method="fork")


if __name__ == "__main__":
    main()
