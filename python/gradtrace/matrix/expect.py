"""The CI gate: ``--write-expect FILE`` records what each layout gives (its verdict and, per parameter, any
accepted factor), ``--expect FILE`` holds a later matrix to it, so that only a new divergence fails. The
file's format: docs/user/matrix.md, "Expectations"."""

from __future__ import annotations

import json

SCHEMA_VERSION = "1.0"


def _scales(r: dict) -> dict:
    return {p["name"]: round(p["scale"], 3) for p in r["params"] if p["verdict"] == "scaled" and p["scale"]}


def build(matrix: dict) -> dict:
    layouts = {}
    for r in matrix["layouts"]:
        if r["status"] == "ran" and r["verdict"] not in ("", "error"):
            layouts[r["name"]] = {"verdict": r["verdict"], "scales": _scales(r),
                                  "not_a_multiple": sorted(p["name"] for p in r["params"]
                                                           if p["verdict"] not in ("match", "scaled"))}
    return {"schema_version": SCHEMA_VERSION, "tool": "gradtrace-matrix", "reference": matrix["reference"]["name"],
            "layouts": layouts}


class BadExpectation(ValueError):
    """An expectation file that does not parse: exit 2."""


def load(path: str) -> dict:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError) as e:
        raise BadExpectation(f"{path}: {e}") from None
    if not isinstance(data, dict) or not isinstance(data.get("layouts"), dict) or \
            str(data.get("schema_version", "")).split(".")[0] != "1":
        raise BadExpectation(f"{path}: not a gradtrace-matrix expectation (schema_version 1.x with layouts)")
    for name, e in data["layouts"].items():
        if not isinstance(e, dict) or not isinstance(e.get("verdict"), str) or \
                not isinstance(e.get("scales", {}), dict) or \
                not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in e.get("scales", {}).values()):
            raise BadExpectation(f"{path}: layout {name!r}: expected "
                                 f"{{\"verdict\": ..., \"scales\": {{name: number}}}}")
    return data


def check(matrix: dict, expected: dict) -> list[str]:
    """What breaks the expectation: a layout whose verdict or factors changed, a new layout that differs, an
    expected layout that was not compared (skipped layouts are noted by the table, not failed)."""
    broken = []
    rows = {r["name"]: r for r in matrix["layouts"]}
    for name, e in expected["layouts"].items():
        r = rows.get(name)
        if r is None or r["status"] == "failed":
            broken.append(f"{name}: expected {e['verdict']}, " + ("not in this matrix" if r is None else
                                                                  f"failed: {r['reason']}"))
            continue
        if r["status"] == "skipped":
            continue
        if r["verdict"] != e["verdict"]:
            broken.append(f"{name}: verdict {r['verdict']}, expected {e['verdict']}")
            continue
        now, then = _scales(r), {k: round(float(v), 3) for k, v in e.get("scales", {}).items()}
        for p in sorted(set(now) | set(then)):
            if now.get(p) != then.get(p):
                broken.append(f"{name}: {p} scale {now.get(p, 1.0):.3f}, expected {then.get(p, 1.0):.3f}")
    for name, r in rows.items():
        if name not in expected["layouts"] and r["status"] == "ran" and r["verdict"] not in ("match", ""):
            broken.append(f"{name}: {r['verdict']} and not in the expectation")
    return broken
