"""From one step's exchanged records to the measurements ``--self`` makes of a trace set
(diff/evidence/self_measurements.h), for this rank's own records: its reductions (the sum S of PRE over
each reduction's members against its POST, at the sketch's positions), the replicas of FINAL it is part
of, the norm of FINAL, its non-finite values, the ranks that skipped the step."""

from __future__ import annotations

import math

import numpy as np

from .observe import Positions, StepRecords


def payload(rank: int, step: int, skipped: bool, records: StepRecords | None, groups: dict,
            reported_norm: float | None) -> dict:
    """What this rank sends of the step: PRE and FINAL at the sketch's positions, each record slice's sum of
    squares (FINAL and POST, for the norms), its groups. Positions are not sent: every rank derives them."""
    entries = records.entries if records is not None else []
    return {
        "rank": rank, "step": step, "skipped": skipped, "groups": groups, "reported_norm": reported_norm,
        "pre": [(e["micro"], e["bucket"], e["group"], e["param"], e["offset"], e["count"], e["values"], e["sumsq"])
                for e in entries if e["phase"] == "PRE_REDUCE"],
        "final": [(e["param"], e["offset"], e["count"], e["values"], e["sumsq"], e.get("sum"), e.get("absmax"))
                  for e in entries if e["phase"] == "FINAL"],
        "post": [(e["micro"], e["param"], e["offset"], e["count"], e["sumsq"])
                 for e in entries if e["phase"] == "POST_REDUCE"],
    }


def reduction_members(group: str, payloads: dict, rank: int, over_replicas: bool) -> list[int]:
    """The ranks a POST over ``group`` on ``rank`` sums: the group's members and, under HSDP, each member's
    replicas (as --self's ReductionMembers)."""
    members = list(payloads[rank]["groups"].get(group, []))
    if not over_replicas:
        return members
    out = set(members)
    for m in members:
        out.update(payloads.get(m, {}).get("groups", {}).get("replicate", []))
    return sorted(out)


def _at(positions: np.ndarray, values: np.ndarray, wanted: np.ndarray):
    """Values at ``wanted`` (a subset of ``positions``, both sorted), and whether every one is there."""
    idx = np.searchsorted(positions, wanted)
    ok = idx < len(positions)
    ok[ok] = positions[idx[ok]] == wanted[ok]
    return values[np.minimum(idx, max(len(values) - 1, 0))] if len(values) else np.zeros(len(wanted)), bool(ok.all())


class _Pre:
    """Every rank's PRE entries of the step, by (rank, micro, bucket), then by (group, parameter)."""

    def __init__(self, payloads: dict, positions: Positions):
        self.by_key: dict[tuple, dict] = {}
        for r, p in payloads.items():
            for micro, bucket, group, pid, offset, count, values, _ in p["pre"]:
                held = self.by_key.setdefault((r, micro, bucket), {})
                held.setdefault((group, pid), (positions.held(pid, offset, count), values))
        self._groups = {key: {g for g, _ in held} for key, held in self.by_key.items()}

    def of(self, member: int, micro: int, bucket: int, group: str, pid: int):
        """Member's PRE of parameter ``pid`` in that bucket (of ``group`` when the bucket id names several)."""
        held = self.by_key.get((member, micro, bucket))
        if held is None:
            return None
        if group in self._groups[(member, micro, bucket)]:
            return held.get((group, pid))
        return next((v for (g, p), v in held.items() if p == pid), None)


def reductions(rank: int, payloads: dict, records: StepRecords, positions: Positions, over_replicas) -> list[dict]:
    """This rank's POST entries against S, summed per (parameter, group) as ReductionSums."""
    pre = _Pre(payloads, positions)
    acc: dict[tuple, dict] = {}
    for e in records.entries:
        if e["phase"] != "POST_REDUCE" or len(e["positions"]) == 0:
            continue
        group, pid = e["group"], e["param"]
        members = reduction_members(group, payloads, rank, over_replicas(group))
        a = acc.setdefault((pid, group), {"param": pid, "group": group, "ss": 0.0, "sp": 0.0, "pp": 0.0, "compared": 0,
                                          "sum_sq": 0.0, "members_sq": 0.0, "buckets": [], "group_size": 0,
                                          "declared": 0.0, "problems": []})
        if e["bucket"] not in a["buckets"]:
            a["buckets"].append(e["bucket"])
        a["group_size"] = max(a["group_size"], len(members))
        if e["divisor"] > 0:
            a["declared"] = e["divisor"]
        if not members:
            a["problems"].append(f"POST_REDUCE of bucket {e['bucket']} names group '{group}', which this rank's "
                                 "layout does not list")
            continue
        s = np.zeros(len(e["positions"]))
        members_sq, missing = 0.0, None
        for m in members:
            found = pre.of(m, e["micro"], e["bucket"], group, pid)
            if found is None:
                missing = m
                break
            vals, complete = _at(found[0], found[1], e["positions"])
            if not complete:
                missing = m
                break
            s += vals
            members_sq += float(np.dot(vals, vals))
        if missing is not None:
            a["problems"].append(f"no PRE_REDUCE of bucket {e['bucket']} from rank {missing}")
            continue
        p = e["values"]
        ss = float(np.dot(s, s))
        a["ss"] += ss
        a["sp"] += float(np.dot(s, p))
        a["pp"] += float(np.dot(p, p))
        a["compared"] += len(p)
        a["sum_sq"] += ss  # ||S||^2 again: the judge reads it for model-parallel reductions only
        a["members_sq"] += members_sq * len(members)
    return list(acc.values())


def replicas(rank: int, payloads: dict, positions: Positions) -> list[dict]:
    """Parameters whose FINAL differs between ranks holding the same elements: per parameter the worst pair
    against the lowest rank holding it, with the relative difference over every element compared, as
    --self's VisitFinal; only those this rank is one of the pair of (each rank says its own)."""
    holders: dict[int, list] = {}
    for r in sorted(payloads):
        for pid, offset, count, values, *_ in payloads[r]["final"]:
            holders.setdefault(pid, []).append((r, positions.held(pid, offset, count), values))
    out = []
    for pid, held in holders.items():
        if len(held) < 2:
            continue
        diff2 = ref2 = 0.0
        worst = (0.0, -1, -1)
        ref_rank, ref_pos, ref_vals = held[0]
        for r, pos, vals in held[1:]:
            common, ia, ib = np.intersect1d(ref_pos, pos, assume_unique=True, return_indices=True)
            if len(common) == 0:
                continue
            d = vals[ib] - ref_vals[ia]
            d2, r2 = float(np.dot(d, d)), float(np.dot(ref_vals[ia], ref_vals[ia]))
            diff2, ref2 = diff2 + d2, ref2 + r2
            rel = math.sqrt(d2 / r2) if r2 > 0 else (1.0 if d2 > 0 else 0.0)
            if rel > worst[0] or not math.isfinite(rel):
                worst = (rel, ref_rank, r)
        rel = math.sqrt(diff2 / ref2) if ref2 > 0 else (1.0 if diff2 > 0 else 0.0)
        if worst[1] >= 0 and rank in (worst[1], worst[2]) and (rel > 0 or not math.isfinite(rel)):
            out.append({"param": pid, "rel": rel if math.isfinite(rel) else 1.0, "rank": worst[1], "other": worst[2]})
    return out


def _distinct(pieces) -> dict:
    """(param, offset, count) -> the rest of the lowest rank's piece (``pieces`` in rank order): a replica counts
    once, as --self reads replicas."""
    out: dict[tuple, tuple] = {}
    for pid, offset, count, *rest in pieces:
        out.setdefault((pid, offset, count), tuple(rest))
    return out


def _covered(distinct: dict) -> dict:
    """param -> the elements its distinct pieces hold."""
    out: dict[int, int] = {}
    for pid, _, count in distinct:
        out[pid] = out.get(pid, 0) + count
    return out


def norm_of(pieces, numels) -> float | None:
    """sqrt of the sum of squares of distinct (param, offset, count, sumsq) pieces, when each parameter they touch
    is covered whole; None otherwise."""
    distinct = _distinct(pieces)
    covered = _covered(distinct)
    if not distinct or any(covered[pid] != numels[pid] for pid in covered):
        return None
    return math.sqrt(sum(sq for sq, in distinct.values()))


def final_norm(payloads: dict, numels) -> float | None:
    """The norm of every rank's FINAL (None when some parameter's FINAL is not whole)."""
    return norm_of([(pid, off, n, sq) for r in sorted(payloads) for pid, off, n, _, sq, *_ in payloads[r]["final"]],
                   numels)


def final_moments(payloads: dict, numels, names) -> dict:
    """name -> (count, sum, sum of squares, abs max, non-finite) of each parameter's whole FINAL, from the ranks'
    distinct pieces; parameters not held whole are left out."""
    distinct = _distinct([(pid, off, n, sq, total, top) for r in sorted(payloads)
                          for pid, off, n, _, sq, total, top in payloads[r]["final"] if total is not None])
    covered = _covered(distinct)
    out: dict[int, list] = {}
    for (pid, _, n), (sq, total, top) in distinct.items():
        m = out.setdefault(pid, [covered[pid], 0.0, 0.0, 0.0, 0])
        finite = math.isfinite(sq) and math.isfinite(total)
        m[1] += total if finite else 0.0
        m[2] += sq if finite else 0.0
        m[3] = max(m[3], top) if math.isfinite(top) else m[3]
        m[4] += 0 if finite else 1
    return {names[pid]: tuple(m) for pid, m in out.items() if m[0] == numels[pid]}


def post_norm(payloads: dict, numels) -> float | None:
    """The norm of every rank's POST of its last micro-step: the reduced gradient before clipping (when each
    parameter is reduced once per step); None when not whole."""
    pieces = []
    for p in (payloads[r] for r in sorted(payloads)):
        if not p["post"]:
            continue
        last = max(m for m, *_ in p["post"])
        pieces += [(pid, off, n, sq) for m, pid, off, n, sq in p["post"] if m == last]
    return norm_of(pieces, numels)


def nonfinite(rank: int, records: StepRecords, seen: set) -> list[dict]:
    """This rank's records holding NaN or Inf (a slice's sum of squares is not finite), one per record, naming
    the parameters not reported before for that phase (``seen``: (phase, param) pairs, updated)."""
    by_record: dict[tuple, list] = {}
    for e in records.entries:
        if not math.isfinite(e["sumsq"]) and (e["phase"], e["param"]) not in seen:
            seen.add((e["phase"], e["param"]))
            by_record.setdefault((e["phase"], e["micro"], e["bucket"], e["group"]), []).append(e["param"])
    return [{"rank": rank, "phase": ph, "micro": mi, "bucket": b, "group": g, "params": ids}
            for (ph, mi, b, g), ids in by_record.items()]
