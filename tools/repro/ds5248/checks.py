"""Was a #5248 cell measurable on CPU? Evidence from the adapter's records, never an assumption.

A cell is "not runnable on CPU" when the ranks' FINAL gradients disagree or POST_REDUCE is not a scaled
sum over the ranks of PRE_REDUCE; KNOWN_CPU_LIMITS quotes what code reading says about the cause.
"""

import pathlib

# What code reading says about the CPU-only failures (deepspeed file:line at each tag); quoted in the
# reason of a cell that the checks above flagged, never used to skip a cell without running it.
KNOWN_CPU_LIMITS = {
    0: ("stage 0 before 0.13: engine.py split_half_float_double_sparse compares t.type() with "
        "'torch.cpu.FloatTensor' (CPU tensors say 'torch.FloatTensor')"),
    1: ("ZeRO-1 before 0.13: the reduction buckets are filtered by the type string "
        "'torch.cpu.FloatTensor' (stage_1_and_2.py split_half_float_double), so nothing is reduced"),
    2: ("ZeRO-2 with contiguous_gradients false: buffered_reduce_fallback filters by the type string "
        "'torch.cpu.FloatTensor' (stage_1_and_2.py split_half_float_double)"),
}



def reduction_check(trace):
    """From the adapter's records of step 0: the largest disagreement between the ranks' FINAL gradients,
    and, where PRE_REDUCE/POST_REDUCE were recorded, the effective divisor d and residual of
    POST ~ (sum over ranks of PRE) / d over the elements each rank holds after the reduction."""
    import numpy as np
    import gradtrace
    from compare import final_grads
    _, spread = final_grads(trace)
    readers = gradtrace.read_trace_set(trace)
    numel = {p["id"]: p["numel"] for p in readers[0].run_info["params"]}
    pre_sum, post, have = {}, {}, {}
    own_pre, own_post = [], []  # each rank's POST against its own PRE, same elements
    recorded = set()
    for r in readers:
        mine = {}
        for f in r.frames():
            if f["type"] != "bucket" or f["step"] != 0 or f["phase"] not in ("PRE_REDUCE", "POST_REDUCE"):
                continue
            recorded.add(f["phase"])
            for s in f["slices"]:
                v = gradtrace.slice_values(s, np.float64)
                # With gradient accumulation each micro-step is reduced on its own: key by micro-step.
                pid, off = (f["micro_step"], s["param_id"]), s["offset"]
                n = numel[s["param_id"]]
                if f["phase"] == "PRE_REDUCE":
                    pre_sum.setdefault(pid, np.zeros(n))[off:off + v.size] += v
                    mine.setdefault(pid, np.zeros(n))[off:off + v.size] += v
                else:
                    post.setdefault(pid, np.zeros(n))[off:off + v.size] = v
                    have.setdefault(pid, np.zeros(n, bool))[off:off + v.size] = True
                    if pid in mine:
                        own_pre.append(mine[pid][off:off + v.size].copy())
                        own_post.append(v)
    out = {"final_rank_spread": spread, "phases_recorded": sorted(recorded)}
    # Per bucket (same bucket ids on every rank): the effective divisor of that bucket alone.
    bpre, bpost = {}, {}
    for r in readers:
        for f in r.frames():
            if f["type"] != "bucket" or f["step"] != 0 or f["phase"] not in ("PRE_REDUCE", "POST_REDUCE"):
                continue
            for sl in f["slices"]:
                v = gradtrace.slice_values(sl, np.float64)
                k = (f["bucket_id"], sl["param_id"], f["micro_step"])
                if f["phase"] == "PRE_REDUCE":
                    acc = bpre.setdefault(k, np.zeros(numel[sl["param_id"]]))
                    acc[sl["offset"]:sl["offset"] + v.size] += v
                else:
                    bpost.setdefault(k, []).append((sl["offset"], v))
    per_bucket = {}
    for (b, pid, micro), parts in bpost.items():
        if (b, pid, micro) not in bpre:
            continue
        ss, sp_ = per_bucket.get(b, (0.0, 0.0))
        for off, v in parts:
            seg = bpre[(b, pid, micro)][off:off + v.size]
            ss, sp_ = ss + float(seg @ seg), sp_ + float(seg @ v)
        per_bucket[b] = (ss, sp_)
    if per_bucket:
        out["bucket_divisors"] = {str(b): round(ss / sp_, 4) if sp_ else None for b, (ss, sp_) in sorted(per_bucket.items())}
    if own_pre:
        a, b = np.concatenate(own_pre), np.concatenate(own_post)
        if float(a @ a) > 0 and np.linalg.norm(b) > 0:
            k = float(a @ b) / float(a @ a)
            out["post_vs_own_pre"] = k
            out["post_vs_own_pre_residual"] = float(np.linalg.norm(b - k * a) / np.linalg.norm(b))
    if pre_sum and post:
        s = np.concatenate([pre_sum[p][have[p]] for p in post if p in pre_sum])
        p = np.concatenate([post[q][have[q]] for q in post if q in pre_sum])
        sp = float(s @ p)
        d = float(s @ s) / sp if sp != 0 else float("inf")
        res = float(np.linalg.norm(p - s / d) / max(np.linalg.norm(p), 1e-30)) if np.isfinite(d) else 1.0
        out.update({"effective_divisor": d, "reduction_residual": res})
    return out


def runnable_problem(check):
    """A reason string when the checks say the reduction did not combine the ranks, else None."""
    if check.get("final_rank_spread", 0.0) > 1e-5:
        return f"the ranks' FINAL gradients disagree (relative spread {check['final_rank_spread']:.2g})"
    if check.get("reduction_residual", 0.0) > 1e-4:
        why = (f"POST_REDUCE is not a scaled sum of the ranks' PRE_REDUCE (residual "
               f"{check['reduction_residual']:.2g})")
        if check.get("post_vs_own_pre_residual", 1.0) < 1e-6:
            why += (f"; each rank's POST_REDUCE = {check['post_vs_own_pre']:.3f} x its own PRE_REDUCE: "
                    f"nothing was reduced")
        return why
    return None


def failure_reason(log):
    try:
        text = pathlib.Path(log).read_text(errors="replace")
    except OSError:
        return ""
    for line in reversed(text.splitlines()):
        if "Error" in line or "error" in line or "assert" in line.lower():
            return line.strip()[:240]
    return ""

