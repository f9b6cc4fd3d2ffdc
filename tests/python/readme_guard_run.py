"""The README's guard line, run as written inside a 2-rank DDP run (gloo, CPU) of adapter_runs.py's tiny LM whose
loss is a sum over the global batch's tokens -- which the README's line declares (loss="global-token-sum") -- while
DDP averages: each gradient is half what it should be, the bug the README's output shows.

    python readme_guard_run.py OUT 'cap = gradtrace.attach(model, "traces/run", ...)'
"""

import multiprocessing
import os
import sys

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from adapter_runs import batch, ce_sum, free_port, make_model  # noqa: E402


def rank_main(rank, out, line, port):
    import gradtrace

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=2)
    torch.set_num_threads(1)
    model = torch.nn.parallel.DistributedDataParallel(make_model())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scope = {"gradtrace": gradtrace, "model": model, "opt": opt}
    exec(line.replace('"traces/run"', repr(out)), scope)  # the README's line, its directory replaced
    cap = scope["cap"]
    for step in range(2):
        tokens, labels = batch(step, ignore=True)
        t, y = tokens[rank * 2:(rank + 1) * 2], labels[rank * 2:(rank + 1) * 2]
        tokens_in_batch = (labels != -100).sum()  # the global batch's valid tokens
        loss = ce_sum(model(t), y) / tokens_in_batch
        loss.backward()
        opt.step()
        opt.zero_grad()
    cap.close()
    dist.destroy_process_group()


def main():
    out, line = sys.argv[1], sys.argv[2]
    port = free_port()
    ranks = [multiprocessing.get_context("fork").Process(target=rank_main, args=(r, out, line, port))
             for r in range(2)]
    for p in ranks:
        p.start()
    for p in ranks:
        p.join()
    sys.exit(max(p.exitcode for p in ranks))


if __name__ == "__main__":
    main()
