#!/usr/bin/env python3
"""Which micro-steps does the gradient the optimizer receives contain? (DeepSpeed #7718)

    python tools/repro/ds7718/micro_check.py TRACE_DIR [--step 0]

TRACE_DIR: a train_hf_zero2.py run with --phases FINAL,POST_REDUCE (ZeRO-2). On each rank, POST_REDUCE
of micro-step k is the rank's partition of the reduced gradient of that micro-step alone (ZeRO-2 frees
.grad after every micro-step's reduction). FINAL restricted to the same elements should be their sum
over the accumulation window; the bug of 0.17.6-0.18.2 would leave only the last micro-step. Prints,
per rank, |FINAL - sum_k POST_k| / |FINAL| and |FINAL - POST_last| / |FINAL| over the owned elements,
as JSON. Exit status 0; 2 with a one-line error for a trace set without POST_REDUCE or FINAL.
"""

import argparse
import json
import sys

import numpy as np

import gradtrace
from gradtrace import read_trace_set


def owned_sums(reader, step):
    """({micro: {(param_id, offset): values}}, {param_id: FINAL values}) of one rank's step."""
    post, final = {}, {}
    for fr in reader.frames():
        if fr["type"] != "bucket" or fr["step"] != step:
            continue
        for sl in fr["slices"]:
            vals = np.asarray(gradtrace.slice_values(sl), dtype=np.float64)
            if fr["phase"] == "POST_REDUCE":
                post.setdefault(fr["micro_step"], {})[(sl["param_id"], sl["offset"])] = vals
            elif fr["phase"] == "FINAL":
                final[sl["param_id"]] = vals
    return post, final


def compare(post, final):
    micros = sorted(post)
    f_parts, sum_parts, last_parts = [], [], []
    for (pid, off), last in post[micros[-1]].items():
        n = last.size
        f_parts.append(final[pid][off:off + n])
        sum_parts.append(sum(post[m].get((pid, off), np.zeros(n)) for m in micros))
        last_parts.append(last)
    f, s, l = (np.concatenate(x) for x in (f_parts, sum_parts, last_parts))
    norm = np.linalg.norm(f)
    return {"micro_steps": micros, "owned_elements": int(f.size), "final_norm": float(norm),
            "rel_diff_vs_sum_of_micro_steps": float(np.linalg.norm(f - s) / norm),
            "rel_diff_vs_last_micro_step": float(np.linalg.norm(f - l) / norm)}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace_dir")
    ap.add_argument("--step", type=int, default=0)
    args = ap.parse_args(argv)
    out = {}
    for reader in read_trace_set(args.trace_dir):
        post, final = owned_sums(reader, args.step)
        if not post or not final:
            print(f"micro_check: {args.trace_dir}: rank {reader.rank} has no POST_REDUCE or no FINAL at step "
                  f"{args.step} (record with --phases FINAL,POST_REDUCE)", file=sys.stderr)
            return 2
        out[f"rank{reader.rank}"] = compare(post, final)
    print(json.dumps(out, indent=1, sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
