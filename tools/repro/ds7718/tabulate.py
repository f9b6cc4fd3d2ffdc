#!/usr/bin/env python3
"""Compare every train_hf_zero2.py run with the reference release's run of the same config, with
gradtrace-diff, and write the results table (docs/studies/deepspeed-versions.md) and its raw JSON.

    python tools/repro/ds7718/tabulate.py RUNS --reference 0.17.5 --results tools/repro/ds7718/results

RUNS holds RELEASE/CONFIG/ (rank-*.gtrace + summary.json), as tools/repro/ds7718/README.md runs them.
For each run: `gradtrace-diff --json` of FINAL at optimizer step 0 against RUNS/REFERENCE/CONFIG. Writes
RESULTS/CONFIG/RELEASE.summary.json (the run's own summary), RESULTS/CONFIG/RELEASE.diff.json (the
report) and RESULTS/results.json (one row per run), and prints the Markdown table. gradtrace-diff is
$GRADTRACE_BUILD_DIR/bin/gradtrace-diff, else the one on PATH.
"""

import argparse
import json
import os
import pathlib
import shutil
import subprocess
import sys


def gradtrace_diff():
    build = os.environ.get("GRADTRACE_BUILD_DIR")
    path = pathlib.Path(build) / "bin" / "gradtrace-diff" if build else shutil.which("gradtrace-diff")
    if not path or not pathlib.Path(path).exists():
        sys.exit("tabulate: gradtrace-diff not found (set GRADTRACE_BUILD_DIR or put it on PATH)")
    return str(path)


def release_key(v):
    return tuple(int(x) for x in v.split("."))


def groups_text(report):
    """gradtrace-diff's groups as 'N x scale' / 'N mismatch', largest first."""
    parts = []
    for g in sorted(report["groups"], key=lambda g: -g["count"]):
        if g["kind"] == "mismatch":
            parts.append(f"{g['count']} not a multiple")
        else:
            parts.append(f"{g['count']} x {g['scale']:.4g}")
    return ", ".join(parts)


def row(release, config, summary, report):
    scales = sorted(p["scale"] for p in report["params"] if p.get("scale") is not None)
    return {
        "release": release, "config": config,
        "diff_exit_code": report["exit_code"], "verdict": report["verdict"],
        "trainer_loss": [s["loss"] for s in summary["steps"]],
        "trainer_grad_norm": [s["grad_norm"] for s in summary["steps"]],
        "reported_grad_norm_step0": report["trace_b"].get("reported_grad_norm"),
        "final_norm_step0": report["grad_norm"].get("computed_b"),
        "reference_final_norm_step0": report["grad_norm"].get("computed_a"),
        "median_scale_b_over_a": scales[len(scales) // 2] if scales else None,
        "max_residual": max(p["residual"] for p in report["params"]),
        "groups": groups_text(report),
        "grad_norm_check": report["grad_norm"].get("message", ""),
        "engine": summary.get("engine", {}),
    }


def markdown(rows, reference):
    out = [f"| config | release | loss (steps 1-3) | reported grad norm (steps 1-3) | norm of FINAL, step 1 | "
           f"B/A vs {reference} (median; groups) | max residual | gradtrace-diff exit |",
           "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        loss = " / ".join(f"{x:.4f}" for x in r["trainer_loss"])
        norms = " / ".join(f"{x:.4f}" for x in r["trainer_grad_norm"])
        out.append(f"| {r['config']} | {r['release']} | {loss} | {norms} | {r['final_norm_step0']:.4f} | "
                   f"{r['median_scale_b_over_a']:.4f}; {r['groups']} | {r['max_residual']:.3g} | "
                   f"{r['diff_exit_code']} |")
    return "\n".join(out)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs")
    ap.add_argument("--reference", required=True, help="the release every run is compared with")
    ap.add_argument("--results", required=True, help="directory for the raw JSON")
    args = ap.parse_args(argv)
    runs, results = pathlib.Path(args.runs), pathlib.Path(args.results)
    diff = gradtrace_diff()
    rows = []
    for cfg_dir in sorted(runs.glob("*/*/summary.json")):
        release, config = cfg_dir.parent.parent.name, cfg_dir.parent.name
        ref = runs / args.reference / config
        if not (ref / "summary.json").exists():
            print(f"tabulate: {config}: no {args.reference} run to compare {release} with; skipped", file=sys.stderr)
            continue
        (results / config).mkdir(parents=True, exist_ok=True)
        report_path = results / config / f"{release}.diff.json"
        subprocess.run([diff, str(ref), str(cfg_dir.parent), "--json", str(report_path)],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        shutil.copyfile(cfg_dir, results / config / f"{release}.summary.json")
        rows.append(row(release, config, json.loads(cfg_dir.read_text()), json.loads(report_path.read_text())))
    rows.sort(key=lambda r: (r["config"], release_key(r["release"])))
    (results / "results.json").write_text(json.dumps({"reference": args.reference, "rows": rows}, indent=1) + "\n")
    print(markdown(rows, args.reference))
    return 0


if __name__ == "__main__":
    sys.exit(main())
