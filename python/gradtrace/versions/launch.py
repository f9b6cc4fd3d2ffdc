"""Starts one process per rank on 127.0.0.1, as torchrun would, and waits for them: how gradtrace-versions runs
a user's script (runner._script), and the launcher of the studies' loops in tools/repro."""

import os
import socket
import subprocess
import sys
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(target, argv, world: int, timeout: float, python=None, extra_env=None, log=None, name="launch") -> int:
    """Start `world` copies of `python TARGET... ARGV` (`target`: a list, [script] or ["-m", module]; `python`
    default this interpreter) with RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT (a
    free port), GRADTRACE_RUN_ID, OMP_NUM_THREADS=1 and `extra_env` set; output
    to the open file `log` (default: inherited). The worst exit status, or 124 when `timeout` s pass first
    (every rank is then killed and `name` says so on stderr)."""
    port = str(free_port())
    procs = []
    for r in range(world):
        env = dict(os.environ, **(extra_env or {}))
        env.update(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=port, GRADTRACE_RUN_ID=f"{name}-{os.getpid()}-{port}",
                   OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([str(python or sys.executable), *map(str, target), *map(str, argv)], env=env,
                                      stdout=log, stderr=subprocess.STDOUT if log else None))
    deadline = time.time() + timeout
    rc = 0
    for p in procs:
        try:
            p.wait(timeout=max(1.0, deadline - time.time()))
        except subprocess.TimeoutExpired:
            for q in procs:
                q.kill()
            print(f"{name}: timed out after {timeout:.0f} s", file=sys.stderr)
            return 124
        rc = rc or p.returncode
    return rc
