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


def reduction_records(trace):
    """Step 0's PRE_REDUCE and POST_REDUCE records of every rank, each slice decoded once: (per rank, a
    list of (phase, bucket_id, micro_step, param_id, offset, float64 values)), and the run's parameters
    (RunInfo params: id, name, numel, ...)."""
    import numpy as np
    import gradtrace
    readers = gradtrace.read_trace_set(trace)
    ranks = []
    for r in readers:
        ranks.append([(f["phase"], f["bucket_id"], f["micro_step"], s["param_id"], s["offset"],
                       gradtrace.slice_values(s, np.float64))
                      for f in r.frames()
                      if f["type"] == "bucket" and f["step"] == 0 and f["phase"] in ("PRE_REDUCE", "POST_REDUCE")
                      for s in f["slices"]])
    return ranks, readers[0].run_info["params"]


def bucket_sums(ranks, params):
    """{(bucket_id, micro_step): (<S,S>, <S,P>, ids of the parameters in the bucket)} for every bucket whose
    POST_REDUCE has a PRE_REDUCE counterpart, with S the sum over the ranks of PRE_REDUCE and P each rank's POST_REDUCE on the
    elements it holds: <S,S>/<S,P> is the bucket's effective divisor."""
    import numpy as np
    numel = {p["id"]: p["numel"] for p in params}
    pre, members = {}, {}
    for records in ranks:
        for phase, b, micro, pid, off, v in records:
            members.setdefault((b, micro), set()).add(pid)
            if phase == "PRE_REDUCE":
                pre.setdefault((b, micro, pid), np.zeros(numel[pid]))[off:off + v.size] += v
    sums = {}
    for records in ranks:
        for phase, b, micro, pid, off, v in records:
            if phase != "POST_REDUCE" or (b, micro, pid) not in pre:
                continue
            seg = pre[(b, micro, pid)][off:off + v.size]
            ss, sp = sums.get((b, micro), (0.0, 0.0))
            sums[(b, micro)] = (ss + float(seg @ seg), sp + float(seg @ v))
    return {k: (ss, sp, members[k]) for k, (ss, sp) in sums.items()}


def reduction_check(trace):
    """From the adapter's records of step 0: the largest disagreement between the ranks' FINAL gradients,
    and, where PRE_REDUCE/POST_REDUCE were recorded, the effective divisor d and residual of
    POST ~ (sum over ranks of PRE) / d over the elements each rank holds after the reduction."""
    import numpy as np
    from compare import final_grads
    _, spread = final_grads(trace)
    ranks, params = reduction_records(trace)
    numel = {p["id"]: p["numel"] for p in params}
    pre_sum, post, have = {}, {}, {}
    own_pre, own_post = [], []  # each rank's POST against its own PRE, same elements
    recorded = set()
    for records in ranks:
        mine = {}
        for phase, _, micro, param_id, off, v in records:
            recorded.add(phase)
            # With gradient accumulation each micro-step is reduced on its own: key by micro-step.
            pid, n = (micro, param_id), numel[param_id]
            if phase == "PRE_REDUCE":
                pre_sum.setdefault(pid, np.zeros(n))[off:off + v.size] += v
                mine.setdefault(pid, np.zeros(n))[off:off + v.size] += v
            else:
                post.setdefault(pid, np.zeros(n))[off:off + v.size] = v
                have.setdefault(pid, np.zeros(n, bool))[off:off + v.size] = True
                if pid in mine:
                    own_pre.append(mine[pid][off:off + v.size].copy())
                    own_post.append(v)
    out = {"final_rank_spread": spread, "phases_recorded": sorted(recorded)}
    # Per bucket (same bucket ids on every rank, micro-steps pooled): the effective divisor of that bucket alone.
    per_bucket = {}
    for (b, _), (ss, sp_, _) in bucket_sums(ranks, params).items():
        t = per_bucket.get(b, (0.0, 0.0))
        per_bucket[b] = (t[0] + ss, t[1] + sp_)
    if per_bucket:
        out["bucket_divisors"] = {str(b): round(ss / sp_, 4) if sp_ else None for b, (ss, sp_) in sorted(per_bucket.items())}
        out["bucket_residual_max"] = max(bucket_residuals(ranks, params).values(), default=0.0)
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


def bucket_residuals(ranks, params):
    """{bucket_id: residual of POST ~ (sum over ranks of PRE) / d_bucket}, d_bucket fitted per bucket (micro-steps
    pooled): 0 when every bucket is a scaled sum, whatever its own divisor."""
    import numpy as np
    numel = {p["id"]: p["numel"] for p in params}
    pre = {}
    for records in ranks:
        for phase, b, micro, pid, off, v in records:
            if phase == "PRE_REDUCE":
                pre.setdefault((b, micro, pid), np.zeros(numel[pid]))[off:off + v.size] += v
    acc = {}
    for records in ranks:
        for phase, b, micro, pid, off, v in records:
            if phase == "POST_REDUCE" and (b, micro, pid) in pre:
                seg = pre[(b, micro, pid)][off:off + v.size]
                ss, sp, pp = acc.get(b, (0.0, 0.0, 0.0))
                acc[b] = (ss + float(seg @ seg), sp + float(seg @ v), pp + float(v @ v))
    return {b: (np.sqrt(max(0.0, pp - sp * sp / ss) / pp) if ss > 0 and pp > 0 else 0.0)
            for b, (ss, sp, pp) in acc.items()}


def runnable_problem(check, per_bucket=False):
    """A reason string when the checks say the reduction did not combine the ranks, else None. per_bucket:
    each bucket must be a scaled sum with its own divisor (ZeRO-3 with reduce_scatter false divides buckets
    above reduce_bucket_size differently from the others, by design); otherwise one divisor for all."""
    if check.get("final_rank_spread", 0.0) > 1e-5:
        return f"the ranks' FINAL gradients disagree (relative spread {check['final_rank_spread']:.2g})"
    residual = check.get("bucket_residual_max", 0.0) if per_bucket else check.get("reduction_residual", 0.0)
    if residual > 1e-4:
        why = (f"POST_REDUCE is not a scaled sum of the ranks' PRE_REDUCE (residual "
               f"{residual:.2g})")
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

