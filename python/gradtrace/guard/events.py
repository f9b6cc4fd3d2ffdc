"""The guard's log, ``out_dir/rank-NNNNN.guard.jsonl``: one JSON object a line, appended and flushed line by
line (a crash keeps every line written), each with ``event`` (``attach``, ``scope``, ``violation``,
``disabled``, ``summary``), ``rank``, ``time`` (Unix seconds) and the event's fields (docs/user/guard.md)."""

from __future__ import annotations

import json
import os
import time

from .. import _gtcodec

# report finding kinds (diff/report.schema.json) that are violations, and the check each belongs to
FINDING_CHECKS = {"replica": "replicas", "nonfinite": "non-finite", "skipped": "skipped-step",
                  "grad-norm": "grad-norm"}
BAD_PARAM_VERDICTS = ("wrong-divisor", "inconsistent")


def log_path(out_dir, rank: int) -> str:
    """``out_dir/rank-NNNNN.guard.jsonl``, beside the rank's trace file."""
    name = _gtcodec.rank_file_name(int(rank))
    return os.path.join(os.fspath(out_dir), name[:-len(".gtrace")] + ".guard.jsonl")


class EventLog:
    def __init__(self, path: str, rank: int):
        self.path, self.rank = path, rank
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        self._file = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open for the run

    def write(self, event: str, **fields) -> dict:
        line = {"event": event, "rank": self.rank, "time": round(time.time(), 3), **fields}
        if self._file is not None:
            self._file.write(json.dumps(line, allow_nan=False, default=str) + "\n")
            self._file.flush()
        return line

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None


def violations(report: dict) -> list[dict]:
    """The violations in a judged step (the self report JSON of _gtcodec.RunJudge.judge): each divisor group holding a
    parameter judged wrong-divisor or inconsistent, and each replica, non-finite, skipped-step and grad-norm
    finding. Each: check, cause, message, params (names), buckets."""
    verdict = {p["name"]: p["verdict"] for p in report.get("self_params", [])}
    buckets: dict[str, list] = {}
    for p in report.get("self_params", []):
        buckets.setdefault(p["name"], []).extend(p.get("buckets", []))
    out = []
    for g in report.get("groups", []):
        if any(verdict.get(n) in BAD_PARAM_VERDICTS for n in g.get("params", [])):
            bs = sorted({b for n in g["params"] for b in buckets.get(n, [])})
            out.append({"check": "divisor", "cause": g.get("cause", ""), "message": g["explanation"],
                        "params": g["params"], "buckets": bs, "divisor": g.get("scale")})
    for f in report.get("findings", []):
        check = FINDING_CHECKS.get(f["kind"])
        if check is not None:
            out.append({"check": check, "cause": "", "message": f["message"], "params": [], "buckets": []})
    return out


def reference_violations(report: dict | None) -> list[dict]:
    """The groups of a comparison with the reference run (the second report of _gtcodec.RunJudge.judge: the diff's) whose
    parameters do not all match, as violations of check "reference" in the diff's words."""
    if not report:
        return []
    verdict = {p["name"]: p["verdict"] for p in report.get("params", [])}
    out = []
    for g in report.get("groups", []):
        if any(verdict.get(n, "match") != "match" for n in g.get("params", [])):
            out.append({"check": "reference", "cause": g.get("cause", ""), "params": g["params"], "buckets": [],
                        "message": "against the reference run (A): " + g["explanation"], "divisor": None})
    return out


def line(rank: int, step: int, v: dict) -> str:
    """The stderr line of one violation: rank, step, buckets, the diff's words (terminal-safe)."""
    where = ""
    if v.get("buckets"):
        bs = v["buckets"]
        where = (f"bucket {bs[0]}" if len(bs) == 1 else f"buckets {', '.join(map(str, bs[:6]))}"
                 + (" ..." if len(bs) > 6 else "")) + f" ({len(v['params'])} parameter{'s' * (len(v['params']) != 1)}): "
    return _gtcodec.terminal_safe(f"gradtrace guard: rank {rank}: step {step}: {where}{v['message']}")
