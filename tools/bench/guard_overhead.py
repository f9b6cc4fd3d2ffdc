#!/usr/bin/env python3
"""Step time of DDP training with the live guard on, against capture off, in one run (issue 45).

    .venv/bin/python tools/bench/guard_overhead.py [--quick] [--worlds 1,2] [--blocks 5] [--steps 6]
        [--configs off,guard,stats,stats+guard] [--json F] [--markdown F] [--profile]

A small transformer LM (gloo, CPU, one intra-op thread per rank) trains with AdamW and clip_grad_norm_.
World 1 is the plain module without a process group; world N is DistributedDataParallel over N spawned
processes. Each world size is ONE run: its processes train every configuration in turn, block by block
(the order rotated per block), so the machine's noise falls on all of them alike:

  off          no gradtrace at all (a fresh model and optimizer that nothing was attached to)
  guard        gradtrace.attach(net, out, optimizer=opt, mode="guard")
  stats        mode="stats" (the trace capture, for comparison)
  stats+guard  both

Every block of every configuration starts from a fresh model (the same initial weights), a fresh DDP
wrapper and optimizer: a DDP comm hook cannot be removed, so "off" must never have seen one. A block runs
--skip untimed steps (DDP's bucket rebuild, AdamW's state), then --steps timed ones, then cap.close()
(untimed: it waits for the last step's exchange, whose judging would otherwise overlap a next step). A
step is timed on each rank from a dist.barrier() to the end of optimizer.step(); its time is the slowest
rank's. Reported: the median step per configuration over all blocks, its ratio to off's, and the guard's
payload (cap.recorder.guard.summary["bytes_sent_per_step"]; each rank receives world x that).

Results go to stdout (a table), --json and --markdown (with the machine); progress to stderr.
See tools/bench/README.md.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import socket
import statistics
import sys
import tempfile
import time

BENCH = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, BENCH)
import diff_bench  # noqa: E402  - machine_info, text_table, md_table: the house style of the other benchmarks

GOAL = 1.03  # issue 45: step time with the guard, x off
CONFIGS = {"off": None, "guard": "guard", "stats": "stats", "stats+guard": "stats+guard"}
# The model: 5.29M parameters in 53 tensors (4 layers x 12, two embeddings, final norm, head); batch 8 makes a
# 2-rank step about half a second on a 2-core machine.
MODEL = {"layers": 4, "hidden": 256, "heads": 4, "vocab": 4096, "seq": 128, "batch": 8}
QUICK_MODEL = {"layers": 2, "hidden": 64, "heads": 2, "vocab": 512, "seq": 32, "batch": 2}


def log(msg: str) -> None:
    print(f"guard_overhead: {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------- the model (torch imported in the ranks only)


def make_model(m: dict):
    import torch
    from torch import nn

    class Block(nn.Module):
        def __init__(self):
            super().__init__()
            h = m["hidden"]
            self.ln1, self.qkv, self.proj = nn.LayerNorm(h), nn.Linear(h, 3 * h), nn.Linear(h, h)
            self.ln2, self.fc1, self.fc2 = nn.LayerNorm(h), nn.Linear(h, 4 * h), nn.Linear(4 * h, h)

        def forward(self, x):
            b, s, h = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, m["heads"], h // m["heads"]).transpose(1, 3).unbind(2)
            a = nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
            x = x + self.proj(a.transpose(1, 2).reshape(b, s, h))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class LM(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed, self.pos = nn.Embedding(m["vocab"], m["hidden"]), nn.Embedding(m["seq"], m["hidden"])
            self.blocks = nn.ModuleList(Block() for _ in range(m["layers"]))
            self.norm, self.head = nn.LayerNorm(m["hidden"]), nn.Linear(m["hidden"], m["vocab"], bias=False)

        def forward(self, tokens):
            x = self.embed(tokens) + self.pos(torch.arange(tokens.shape[1]))
            for blk in self.blocks:
                x = blk(x)
            return self.head(self.norm(x))

    return LM()


# ---------------------------------------------------------------- one rank


def run_rank(rank: int, world: int, args, port: int, tmp: str, result_path: str) -> None:
    import torch
    import torch.distributed as dist

    import gradtrace

    torch.set_num_threads(1)  # world 2 on 2 cores: one core per rank
    if world > 1:
        os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
        dist.init_process_group("gloo", rank=rank, world_size=world)
    barrier = dist.barrier if world > 1 else (lambda: None)
    m = args.model
    torch.manual_seed(1234)
    initial = make_model(m).state_dict()
    gen = torch.Generator().manual_seed(100 + rank)  # this rank's batches, the same for every configuration
    data = [torch.randint(0, m["vocab"], (m["batch"], m["seq"] + 1), generator=gen) for _ in range(4)]

    def fresh(config: str, out: str):
        model = make_model(m)
        model.load_state_dict(initial)
        net = torch.nn.parallel.DistributedDataParallel(model) if world > 1 else model
        opt = torch.optim.AdamW(net.parameters(), lr=1e-4)
        cap = None
        if CONFIGS[config] is not None:
            cap = gradtrace.attach(net, out, optimizer=opt, mode=CONFIGS[config], loss="local-mean")
        else:  # "off" must be training without any of gradtrace's hooks
            assert not model._forward_pre_hooks and not getattr(net, "_comm_hooks", None)
            assert not opt._optimizer_step_pre_hooks and not opt._optimizer_step_post_hooks
            assert "zero_grad" not in vars(opt)
        return net, opt, cap

    def train_step(net, opt, cap, i: int) -> None:
        batch = data[i % len(data)]
        logits = net(batch[:, :-1])
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, m["vocab"]), batch[:, 1:].reshape(-1))
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(net.parameters(), args.clip)
        if cap is not None:
            cap.report_grad_norm(norm)
        opt.step()
        opt.zero_grad(set_to_none=True)

    def block(config: str, tag: str, skip: int, steps: int, profile=None) -> tuple[list, float, dict | None]:
        out = os.path.join(tmp, f"w{world}-{config.replace('+', '-')}-{tag}")
        net, opt, cap = fresh(config, out)
        times = []
        for i in range(skip + steps):
            if i == skip:  # this process's CPU over the timed steps: the guard's thread included, the load's not
                cpu0 = time.process_time()
            barrier()
            timed = i >= skip
            if timed and profile is not None:
                profile.enable()
            t0 = time.perf_counter()
            train_step(net, opt, cap, i)
            dt = time.perf_counter() - t0
            if timed and profile is not None:
                profile.disable()
            if timed:
                times.append(dt)
        cpu = (time.process_time() - cpu0) / steps
        guard = None
        if cap is not None:
            cap.close()
            g = cap.recorder.guard
            if g is not None:
                guard = {"bytes_sent_per_step": g.summary["bytes_sent_per_step"], "violations": g.summary["violations"],
                         "steps_checked": g.summary["steps_checked"], "disabled": g.disabled}
        barrier()
        if rank == 0:
            shutil.rmtree(out, ignore_errors=True)
        return times, cpu, guard

    # Warm-up: every configuration once, untimed (allocator, gloo connections, the guard's first group).
    for config in args.configs:
        block(config, "warmup", 1, 1 if args.quick else 2)
    times = {c: [] for c in args.configs}
    cpus = {c: [] for c in args.configs}
    guards = {c: [] for c in args.configs}
    profile = None
    for b in range(args.blocks):
        order = args.configs[b % len(args.configs):] + args.configs[:b % len(args.configs)]
        for config in order:
            if args.profile and rank == 0 and config == "guard" and b == args.blocks - 1:
                import cProfile

                profile = cProfile.Profile()
            t, cpu, g = block(config, f"b{b}", args.skip, args.steps, profile if config == "guard" else None)
            times[config].append(t)
            cpus[config].append(cpu)
            if g is not None:
                guards[config].append(g)
        if rank == 0:
            log(f"world {world}: block {b + 1}/{args.blocks} done")
    # A step takes as long as its slowest rank.
    every = [(times, cpus)]
    if world > 1:
        every = [None] * world
        dist.all_gather_object(every, (times, cpus))
    slowest = {c: [[max(r[c][b][i] for r, _ in every) for i in range(args.steps)] for b in range(args.blocks)]
               for c in args.configs}
    cpu_mean = {c: [statistics.mean(r[c][b] for _, r in every) for b in range(args.blocks)] for c in args.configs}
    all_guards = [guards]
    if world > 1:
        all_guards = [None] * world
        dist.all_gather_object(all_guards, guards)
        dist.destroy_process_group()
    if rank == 0:
        params = list(make_model(m).parameters())
        with open(result_path, "w") as f:
            json.dump({"steps": slowest, "cpu": cpu_mean, "guards": all_guards,
                       "params": sum(p.numel() for p in params), "tensors": len(params)}, f)
        if profile is not None:
            import pstats

            log(f"world {world}: cProfile of rank 0's timed guard steps, last block (training thread only):")
            pstats.Stats(profile, stream=sys.stderr).sort_stats("cumulative").print_stats(25)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_world(world: int, args) -> dict:
    import torch.multiprocessing as mp

    tmp = tempfile.mkdtemp(prefix=f"guard_overhead-w{world}-")
    result = os.path.join(tmp, "result.json")
    t0, load0 = time.perf_counter(), os.getloadavg()[0]
    try:
        if world == 1:
            run_rank(0, 1, args, 0, tmp, result)
        else:
            mp.start_processes(run_rank, args=(world, args, free_port(), tmp, result), nprocs=world, join=True,
                               start_method="spawn")
        with open(result) as f:
            out = json.load(f)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    out["seconds"] = round(time.perf_counter() - t0, 1)
    out["load"] = [round(load0, 2), round(os.getloadavg()[0], 2)]  # 1-minute load average at start and end
    return out


# ---------------------------------------------------------------- results


def summarize(world: int, res: dict, configs: list) -> list[dict]:
    rows = []
    off = statistics.median(s for blk in res["steps"]["off"] for s in blk)
    off_cpu = statistics.median(res["cpu"]["off"])
    for c in configs:
        steps = [s for blk in res["steps"][c] for s in blk]
        med = statistics.median(steps)
        cpu = statistics.median(res["cpu"][c])
        row = {"world": world, "config": c, "median_s": med, "ratio": med / off,
               "block_medians_s": [statistics.median(blk) for blk in res["steps"][c]], "steps_s": steps,
               "cpu_s": cpu, "cpu_ratio": cpu / off_cpu, "block_cpu_s": res["cpu"][c]}
        g = [x for rank in res["guards"] for x in rank.get(c, [])]
        if g:
            sent = max(x["bytes_sent_per_step"] for x in g)
            row.update(bytes_sent=sent, bytes_received=world * sent, violations=sum(x["violations"] for x in g),
                       disabled=sorted({x["disabled"] for x in g if x["disabled"]}),
                       steps_checked=min(x["steps_checked"] for x in g))
        rows.append(row)
    return rows


HEAD = ["world", "config", "median step s", "x off", "block medians s (min-max)", "goal <= 1.03x", "CPU s/step/rank",
        "CPU x off",
        "guard bytes sent / received per step and rank", "violations"]


def table(rows: list[dict]) -> list[list]:
    body = []
    for r in rows:
        bm = r["block_medians_s"]
        goal = ("✓" if r["ratio"] <= GOAL else "✗") if r["config"] == "guard" else ""
        nbytes = ""
        if "bytes_sent" in r:  # one rank pickles its payload but sends nothing
            nbytes = (f"{r['bytes_sent']:,} / {r['bytes_received']:,}" if r["world"] > 1 else
                      f"none ({r['bytes_sent']:,} pickled)")
        viol = "" if "violations" not in r else str(r["violations"]) + (" (disabled!)" if r["disabled"] else "")
        body.append([r["world"], r["config"], f"{r['median_s']:.3f}", f"{r['ratio']:.3f}", f"{min(bm):.3f}-{max(bm):.3f}",
                     goal, f"{r['cpu_s']:.3f}", f"{r['cpu_ratio']:.3f}", nbytes, viol])
    return body


def model_line(args, res: dict) -> str:
    m = args.model
    return (f"transformer LM, {m['layers']} layers, hidden {m['hidden']}, {m['heads']} heads, vocab {m['vocab']}, "
            f"seq {m['seq']}, batch {m['batch']} per rank; {res['params'] / 1e6:.2f}M parameters in "
            f"{res['tensors']} tensors; AdamW, clip_grad_norm_({args.clip:g}); gloo on CPU, 1 thread per rank")


def legend(args) -> str:
    return (f"{args.blocks} blocks x {args.steps} timed steps per configuration (after {args.skip} untimed per block "
            "and an untimed warm-up block each), configurations alternated block by block in the same processes, "
            "the order rotated per block; a fresh model (same weights), DDP wrapper and optimizer per block. Step: "
            "dist.barrier(), then forward, backward, clip_grad_norm_, optimizer.step(), timed on each rank; the "
            "slowest rank's time counts. median step s: over every timed step of every block; x off: that median "
            "over off's; block medians: the spread between blocks. CPU s/step/rank: each rank process's CPU time "
            "(time.process_time, every thread: the guard's too) over a block's timed steps / steps, averaged over the "
            "ranks, median over the blocks: what the configuration costs without the waits (a rank's for the other in "
            "an all-reduce), though it still moves with other work on the machine (shared caches, memory bandwidth, "
            "clock). Guard bytes: the pickled payload one rank sends "
            "per step (the largest over its steps and ranks), and what each rank receives from the all_gather "
            "(world x that, its own included; all_gather_object adds an 8-byte size per rank); one rank sends "
            "nothing. Goal (issue 45): guard <= 1.03x off.")


def emit(args, machine: dict, results: dict) -> None:
    rows = [r for w in args.worlds for r in summarize(w, results[w], args.configs)]
    head, body = HEAD, table(rows)
    first = results[args.worlds[0]]
    print(f"machine: {diff_bench.machine_line(machine)}")
    print(f"model: {model_line(args, first)}")
    print(diff_bench.text_table(head, body))
    notes = []
    if machine["loadavg_start"][0] > 0.5 * machine["usable_cpus"]:
        notes.append(f"load average {machine['loadavg_start'][0]} on {machine['usable_cpus']} cores at start: "
                     "other work shared the machine; timings are noisy upper bounds")
    if args.quick:
        notes.append("--quick: a tiny model and few steps; checks the script, says nothing about the goal")
    for w in args.worlds:
        notes.append(f"world {w}: the run took {results[w]['seconds']} s, load average {results[w]['load'][0]} at its "
                     f"start, {results[w]['load'][1]} at its end")
    for n in notes:
        print(f"note: {n}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine, "model": {**args.model, "params": first["params"],
                                                     "tensors": first["tensors"]},
                       "blocks": args.blocks, "steps": args.steps, "skip": args.skip, "goal": GOAL, "rows": rows,
                       "notes": notes, "legend": legend(args)}, f, indent=1)
        log(f"wrote {args.json}")
    if args.markdown:
        parts = [f"Measured with `.venv/bin/python tools/bench/guard_overhead.py {' '.join(args.argv)}` on: "
                 f"{diff_bench.machine_line(machine)}.", "", f"Model: {model_line(args, first)}.", "",
                 diff_bench.md_table(head, body), "", legend(args), ""] + [f"- {n}" for n in notes]
        with open(args.markdown, "w") as f:
            f.write("\n".join(parts).rstrip() + "\n")
        log(f"wrote {args.markdown}")


def parse_args(argv):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--quick", action="store_true", help="tiny model, 2 blocks x 2 steps: checks the script")
    ap.add_argument("--worlds", default="1,2", help="comma-separated world sizes (1: no process group)")
    ap.add_argument("--blocks", type=int, default=5, help="blocks per configuration (default 5)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per block (default 6)")
    ap.add_argument("--skip", type=int, default=1, help="untimed steps at the start of each block (default 1)")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"subset of {','.join(CONFIGS)}")
    # The default never clips, so no step is a violation whose printing would be timed: at 9aac00a the guard took
    # a norm reported before clipping at one rank (no POST_REDUCE to tell it by) for a wrong one (since d8f8cd2 it
    # scopes that check out). The guard's work is the same either way.
    ap.add_argument("--clip", type=float, default=1e9, help="clip_grad_norm_'s max_norm (default 1e9: never clips)")
    ap.add_argument("--batch", type=int, help=f"sequences per rank (default {MODEL['batch']})")
    ap.add_argument("--profile", action="store_true",
                    help="cProfile rank 0's timed guard steps of the last block (training thread) to stderr")
    ap.add_argument("--json", help="write the results as JSON to FILE")
    ap.add_argument("--markdown", help="write the table as Markdown (for docs/dev/performance.md) to FILE")
    args = ap.parse_args(argv)
    args.argv = argv
    args.worlds = [int(x) for x in args.worlds.split(",") if x]
    args.configs = [x for x in args.configs.split(",") if x]
    unknown = [c for c in args.configs if c not in CONFIGS]
    if unknown or "off" not in args.configs:
        ap.error(f"--configs: {unknown or 'off is needed'}: expected a subset of {','.join(CONFIGS)} with off")
    if args.quick:
        args.blocks, args.steps = min(args.blocks, 2), min(args.steps, 2)
    args.model = dict(QUICK_MODEL if args.quick else MODEL)
    if args.batch:
        args.model["batch"] = args.batch
    return args


def main(argv=None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    machine = diff_bench.machine_info()
    results = {}
    for w in args.worlds:
        log(f"world {w}: {len(args.configs)} configurations x {args.blocks} blocks x {args.steps} steps")
        results[w] = run_world(w, args)
    machine["loadavg_end"] = [round(x, 2) for x in os.getloadavg()]
    emit(args, machine, results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
