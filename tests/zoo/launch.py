"""One gloo launch of 4 CPU ranks that runs every zoo scenario in sequence, each on ranks
0..world-1 of the launch with its own subgroups, writing its trace set to OUT/<scenario>/
(one launch instead of one per run: starting torch four times dominates a run's cost).

    python tests/zoo/launch.py OUT [SCENARIO ...]
"""

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
from runs import SCENARIOS  # noqa: E402

WORLD = 4
SUBGROUPS = [(0, 1), (2, 3), (0, 2), (1, 3)]  # every rank creates every group, in this order


class Ranks:
    """This rank's view of the launch: ``group(ranks)`` is the process group of those global ranks
    (None for one rank: nothing to reduce)."""

    def __init__(self, rank):
        self.rank = rank
        self._groups = {tuple(range(WORLD)): dist.group.WORLD}
        for ranks in SUBGROUPS:
            self._groups[ranks] = dist.new_group(list(ranks))

    def group(self, ranks):
        ranks = tuple(ranks)
        return None if len(ranks) == 1 else self._groups[ranks]


def run_rank(rank, out, port, names):
    start = time.perf_counter()
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=WORLD)
    torch.set_num_threads(1)
    ranks = Ranks(rank)
    if rank == 0:
        print(f"zoo: {WORLD} ranks up in {time.perf_counter() - start:.1f} s", file=sys.stderr, flush=True)
    for sc in SCENARIOS:
        if names and sc.name not in names:
            continue
        start = time.perf_counter()
        if rank < sc.world:
            sc.run(ranks, pathlib.Path(out) / sc.name)
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
    out, names = argv[0], set(argv[1:])
    unknown = names - {sc.name for sc in SCENARIOS}
    if unknown:
        sys.exit(f"launch.py: unknown scenarios {sorted(unknown)}")
    # fork: the ranks inherit the imported torch instead of importing it four more times
    mp.start_processes(run_rank, args=(out, free_port(), names), nprocs=WORLD, join=True, start_method="fork")


if __name__ == "__main__":
    main()
