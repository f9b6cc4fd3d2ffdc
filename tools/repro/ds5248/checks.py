"""Was a #5248 cell measurable on CPU? Evidence from the adapter's records, never an assumption.

A cell is "not runnable on CPU" when the ranks' FINAL gradients disagree or POST_REDUCE is not a scaled
sum over the ranks of PRE_REDUCE; KNOWN_CPU_LIMITS quotes what code reading says about the cause. The
effective divisors are gradtrace-diff --self's (its JSON report); this file only pools and judges them.
"""

import pathlib

from compare import final_grads, run_diff

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


def self_report(trace):
    """`gradtrace-diff --self TRACE --step 0 --json`: the reductions' effective divisors per parameter
    (self_params[]) and per rank x bucket (bucket_view[]), diff/REPORT_SCHEMA.md."""
    return run_diff(["--self", trace, "--step", "0"])


def _common_divisor(self_params):
    """(d, residual): the median of the parameters' effective divisors, and the largest residual of
    POST ~ S / d over the parameters. Exact from each parameter's own fit (divisor d_p, residual r_p):
    P - S/d_p is orthogonal to S, so ||P - S/d||^2 / ||P||^2 = r_p^2 + (1 - r_p^2) (1 - d_p/d)^2."""
    fits = [(q["divisor"], q["residual"] or 0.0) for q in self_params if q["divisor"]]
    if not fits:
        return None, None
    ds = sorted(d for d, _ in fits)
    d = ds[len(ds) // 2]
    return d, max((r * r + (1 - r * r) * (1 - dp / d) ** 2) ** 0.5 for dp, r in fits)


def _pooled(cells):
    """(divisor, residual) of one least-squares fit over several bucket_view cells, from each cell's
    divisor d, residual r and ||P||: <S,P> = d ||P||^2 (1 - r^2), <S,S> = d <S,P>."""
    ss = sp = pp = 0.0
    for c in cells:
        w = c["post_norm"] ** 2 * (1 - (c["residual"] or 0.0) ** 2)
        ss, sp, pp = ss + c["divisor"] ** 2 * w, sp + c["divisor"] * w, pp + c["post_norm"] ** 2
    if not sp or not pp:
        return None, 0.0
    return ss / sp, (max(0.0, pp - sp * sp / ss) / pp) ** 0.5


def bucket_divisors(report):
    """{bucket_id: (divisor, residual)}, ranks and micro-steps pooled, from the report's bucket_view."""
    cells = {}
    for c in report["bucket_view"]:
        if c["divisor"]:
            cells.setdefault(c["bucket_id"], []).append(c)
    return {b: _pooled(cs) for b, cs in sorted(cells.items())}


def step0_buckets(trace):
    """({bucket_id: ids of the parameters in it}, phases recorded) of step 0's PRE_REDUCE and POST_REDUCE
    records over every rank: bookkeeping from the index (format 1.1+), no gradient values read."""
    import gradtrace
    members, phases = {}, set()
    for r in gradtrace.read_trace_set(trace):
        entries = r.index() if r.catalogued else \
            [dict(f, param_ids=[s["param_id"] for s in f["slices"]]) for f in r.frames() if f["type"] == "bucket"]
        for e in entries:
            if e["type"] == "bucket" and e["step"] == 0 and e["phase"] in ("PRE_REDUCE", "POST_REDUCE"):
                phases.add(e["phase"])
                members.setdefault(e["bucket_id"], set()).update(e["param_ids"])
    return members, sorted(phases)


def reduction_records(trace):
    """Step 0's PRE_REDUCE and POST_REDUCE records of every rank, decoded: (per rank, a list of (phase,
    bucket_id, micro_step, param_id, offset, float64 values)), and the run's parameters (RunInfo params)."""
    import numpy as np
    import gradtrace
    readers = gradtrace.read_trace_set(trace)
    ranks = [[(f["phase"], f["bucket_id"], f["micro_step"], s["param_id"], s["offset"],
               gradtrace.slice_values(s, np.float64))
              for f in r.frames()
              if f["type"] == "bucket" and f["step"] == 0 and f["phase"] in ("PRE_REDUCE", "POST_REDUCE")
              for s in f["slices"]]
             for r in readers]
    return ranks, readers[0].run_info["params"]


def post_vs_own_pre(trace):
    """k and residual of each rank's POST_REDUCE ~ k x its own PRE_REDUCE on the same elements (k = 1,
    residual 0: nothing was reduced). Computed here: gradtrace-diff --self compares POST with the sum over
    the group, and its JSON does not carry a rank's POST against its own PRE."""
    import numpy as np
    ranks, params = reduction_records(trace)
    numel = {p["id"]: p["numel"] for p in params}
    own_pre, own_post = [], []
    for records in ranks:
        mine = {}
        for phase, _, micro, param_id, off, v in records:
            key = (micro, param_id)
            if phase == "PRE_REDUCE":
                mine.setdefault(key, np.zeros(numel[param_id]))[off:off + v.size] += v
            elif key in mine:
                own_pre.append(mine[key][off:off + v.size].copy())
                own_post.append(v)
    if not own_pre:
        return {}
    a, b = np.concatenate(own_pre), np.concatenate(own_post)
    if float(a @ a) <= 0 or np.linalg.norm(b) <= 0:
        return {}
    k = float(a @ b) / float(a @ a)
    return {"post_vs_own_pre": k, "post_vs_own_pre_residual": float(np.linalg.norm(b - k * a) / np.linalg.norm(b))}


def reduction_check(trace):
    """From the adapter's records of step 0: the largest disagreement between the ranks' FINAL gradients,
    and, where PRE_REDUCE/POST_REDUCE were recorded, gradtrace-diff --self's effective divisors: one for
    all parameters (effective_divisor, reduction_residual: POST ~ (sum over ranks of PRE) / d), and one per
    bucket (bucket_divisors, bucket_residual_max). When POST is not such a sum, also each rank's POST
    against its own PRE (post_vs_own_pre)."""
    _, spread = final_grads(trace)  # "do the ranks agree": not a divisor, see final_grads
    report = self_report(trace)
    out = {"final_rank_spread": spread, "phases_recorded": step0_buckets(trace)[1]}
    per_bucket = bucket_divisors(report)
    if per_bucket:
        out["bucket_divisors"] = {str(b): round(d, 4) if d else None for b, (d, _) in per_bucket.items()}
        out["bucket_residual_max"] = max(r for _, r in per_bucket.values())
    d, residual = _common_divisor(report["self_params"])
    if d is not None:
        out.update({"effective_divisor": d, "reduction_residual": residual})
        if residual > 1e-4:
            out.update(post_vs_own_pre(trace))
    return out


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

