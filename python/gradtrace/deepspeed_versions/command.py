"""gradtrace-deepspeed-versions: run one training entry point under several DeepSpeed releases, capture
each, and say which release changed the gradients the optimizer receives.

    gradtrace-deepspeed-versions --config ds.json --model ds5248 --sp 2 --releases 0.11.1,0.11.2
    gradtrace-deepspeed-versions --config ds.json --model moe --dp 2 --sp 1 --from 0.12.0 --to 0.13.1
    gradtrace-deepspeed-versions --config ds.json --script train.py --dp 2 --sp 1 --releases 0.16.4,0.18.3
    gradtrace-deepspeed-versions --config ds.json --model ds5248 --bisect 0.10.3 0.19.8 --markdown report.md

For each release it creates (or reuses) a Python environment with that DeepSpeed (dsversions_envs: a venv
per release over a shared torch base; the host's own DeepSpeed runs in the host interpreter), runs the
entry point on CPU/gloo with sp x dp ranks, captures it (gradtrace.deepspeed_adapter), and compares the
FINAL gradients of optimizer step 0 with `gradtrace-diff --json` against the reference and against the
previous release. It prints a table (release -> scale and residual per parameter group, loss, the grad norm
DeepSpeed reported), the first release at which anything changed, and gradtrace-diff's report of that
transition. Results are cached (--cache-dir): a second call with the same release, config, entry point,
layout and reference runs nothing.

Reference (--reference): `single-rank` (default) runs the entry point on one rank over the same global batch
(micro-batch x dp rows, ZeRO stage of the config: with one rank nothing is reduced) with the host's
DeepSpeed, or the newest release compared when the host has none; `--reference-release X` takes release X
(same layout) as the good one.

--bisect GOOD BAD: binary search over the published releases between GOOD and BAD (PyPI; yanked and
pre-releases skipped) for the first release whose gradients differ from GOOD's; a release whose env or run
fails is skipped as in `git bisect skip`. Only the visited releases' envs are built.

Script contract (--script PATH): the command starts PATH once per rank with the release's interpreter, as
`python PATH [--script-arg ...]`, with this environment:
    RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT  torch.distributed's env://
    DS_ACCELERATOR=cpu, OMP_NUM_THREADS=1
    GRADTRACE_OUT_DIR            the trace directory: pass it to gradtrace.deepspeed_adapter.attach(engine, dir)
    GRADTRACE_DS_CONFIG          the DeepSpeed config (JSON) to use; for the single-rank reference it is the
                                 user's config with train_micro_batch_size_per_gpu x dp and no train_batch_size
    GRADTRACE_SP, GRADTRACE_DP   this run's layout (1 and 1 for the single-rank reference, which must train
                                 on the same global batch: the rows the dp ranks hold together)
    GRADTRACE_DEEPSPEED_RELEASE  the release under test (informational)
    PYTHONPATH                   this gradtrace package first
The script initialises torch.distributed (e.g. deepspeed.init_distributed(dist_backend="gloo")), builds
the same weights and data whatever the layout (seeded), calls attach(...) before the first step,
cap.record_step(loss, valid_tokens) after each backward, runs at least one optimizer step, calls
cap.close(), and exits 0 on every rank. Anything else it prints goes to the run's log.

Exit status: 0 every release ran and its gradients match the reference; 1 a release differs from the
reference or from its predecessor, or failed (bisect: 1 when no single first bad release could be named);
2 bad input (one line on stderr naming what is wrong).
"""

import argparse
import hashlib
import json
import pathlib
import shlex
import sys
import time

from gradtrace.deepspeed_versions import bisection as bisect_mod
from gradtrace.deepspeed_versions import cache as cache_mod
from gradtrace.deepspeed_versions import envs, releases, report, runner


class BadInput(Exception):
    pass


def parse_args(argv):
    ap = argparse.ArgumentParser(prog="gradtrace-deepspeed-versions", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", required=True, help="DeepSpeed config (JSON file)")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--model", choices=["ds5248", "moe"], help="built-in entry point: the #5248 Ulysses loop "
                      "with a tiny dense model (ds5248) or with DeepSpeed MoE layers of 2 experts (moe)")
    what.add_argument("--script", help="your training script (see the script contract above)")
    what.add_argument("--emulation", action="store_true",
                      help="each release is gradtrace-train --scaling deepspeed@RELEASE (its C++ emulation of that "
                           "release's reduction; needs gradtrace-train): checks the command without DeepSpeed envs")
    ap.add_argument("--script-arg", action="append", default=[], help="an argument for --script (repeatable)")
    ap.add_argument("--sp", type=int, default=2, help="Ulysses sequence-parallel size (default 2)")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel size (default 1)")
    ap.add_argument("--loss", default="loss", choices=["loss", "loss-div-sp", "token-weighted",
                                                       "global-token-weighted", "full-sequence"],
                    help="built-in loop's loss recipe (default: loss, the #5248 issue's loop)")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--releases", help="comma-separated releases, compared in the order given")
    which.add_argument("--from", dest="range_from", help="first release of a range (with --to)")
    which.add_argument("--bisect", nargs=2, metavar=("GOOD", "BAD"), help="find the first bad release")
    ap.add_argument("--to", dest="range_to", help="last release of a range (with --from)")
    ap.add_argument("--release-list", help="comma-separated release list used for --from/--to and --bisect "
                                           "instead of PyPI's published releases")
    ap.add_argument("--reference", choices=["single-rank"], default="single-rank")
    ap.add_argument("--reference-release", help="take this release (same layout) as the reference")
    ap.add_argument("--env-root", type=pathlib.Path, default=envs.DEFAULT_ROOT,
                    help=f"where the per-release environments live (default {envs.DEFAULT_ROOT})")
    ap.add_argument("--cache-dir", type=pathlib.Path, default=cache_mod.DEFAULT_ROOT,
                    help=f"results cache (default {cache_mod.DEFAULT_ROOT})")
    ap.add_argument("--no-build", action="store_true", help="never create an environment (missing: run fails)")
    ap.add_argument("--rerun", action="store_true", help="ignore cached results (and replace them)")
    ap.add_argument("--rerun-failed", action="store_true", help="run again the releases whose cached run failed")
    ap.add_argument("--refresh-releases", action="store_true", help="re-read PyPI's release list now")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    ap.add_argument("--json", type=pathlib.Path, help="write every result to this JSON file")
    ap.add_argument("--markdown", type=pathlib.Path, help="write the Markdown report to this file")
    args = ap.parse_args(argv)
    if (args.range_from is None) != (args.range_to is None):
        ap.error("--from and --to go together")
    if args.sp < 1 or args.dp < 1:
        ap.error("--sp and --dp must be >= 1")
    return args


def load_config(path):
    try:
        cfg = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not a readable JSON DeepSpeed config ({e})") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{path}: a DeepSpeed config is a JSON object")
    return cfg


def check_release(v, what):
    try:
        releases.version_key(v)
    except ValueError:
        raise BadInput(f"{what}: {v!r} is not a release number (e.g. 0.14.3)") from None
    return v


class Study:
    """One invocation: runs (cached), diffs (cached) and the rows of the table."""

    def __init__(self, args, cfg):
        self.args, self.cfg = args, cfg
        self.cache = cache_mod.Cache(args.cache_dir)
        if args.script:
            script = pathlib.Path(args.script)
            if not script.is_file():
                raise BadInput(f"{script}: no such script")
            self.entry = runner.Entry("script", str(script.resolve()), tuple(args.script_arg), args.loss)
        elif args.emulation:
            self.entry = runner.Entry("emulation", "gradtrace-train", (), args.loss)
        else:
            self.entry = runner.Entry("model", args.model, (), args.loss)
        self.layout = runner.Layout(args.sp, args.dp)
        self.digest = self.entry.digest()
        self.runs_executed = 0
        self.host = envs.host_deepspeed_version()

    def cfg_hash(self, cfg):
        return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]

    def capture(self, release, layout, cfg, label):
        """A finished run of `release` (from the cache or run now): its result dict with key and trace."""
        k = cache_mod.key(release=release, config=self.cfg_hash(cfg), entry=self.digest, layout=layout.text(),
                          kind=self.entry.kind)
        got = None if self.args.rerun else self.cache.load(k)
        if got is not None and got["status"] != "ok" and self.args.rerun_failed:
            got = None
        if got is not None:
            got["cached"] = True
            return got
        d = self.cache.run_dir(k)
        d.mkdir(parents=True, exist_ok=True)
        (d / "config.json").write_text(json.dumps(cfg, indent=1))
        t0 = time.time()
        res = {"key": k, "release": release, "trace": str(d / "trace"), "log": str(d / "run.log"), "cached": False}
        try:
            python = (sys.executable if self.entry.kind == "emulation" else
                      envs.python_of(release, self.args.env_root, build=not self.args.no_build,
                                     log=d / "env.log"))
            res["python"] = str(python)
            res["env_seconds"] = round(time.time() - t0, 1)
            t1 = time.time()
            self.runs_executed += 1
            rc = runner.run(self.entry, python, d / "config.json", layout, d / "trace", d / "run.log", release,
                            self.args.timeout)
            res["run_seconds"] = round(time.time() - t1, 1)
            if rc != 0:
                res.update(status="failed", error=f"run exited {rc}: {last_error(d / 'run.log')} (log {d / 'run.log'})")
            else:
                res.update(status="ok", **runner.summarize(d / "trace"))
        except (envs.EnvError, OSError) as e:
            res.update(status="failed", error=f"environment: {e}")
        res["seconds"] = round(time.time() - t0, 1)
        self.cache.store(k, res)
        print(f"  {label}: deepspeed {release} {res['status']} in {res['seconds']:.0f} s"
              + (f" (env {res.get('env_seconds', 0):.0f} s, run {res.get('run_seconds', 0):.0f} s)"
                 if res['status'] == 'ok' else f": {res.get('error', '')[:200]}"), file=sys.stderr, flush=True)
        return res

    def compare(self, a, b, markdown=False):
        """gradtrace-diff a b (runs' result dicts), cached next to the runs; verdict, summary and groups."""
        jp, mp = self.cache.diff_paths(a["key"], b["key"])
        if jp.exists() and (not markdown or mp.exists()) and not self.args.rerun:
            rep = json.loads(jp.read_text())
        else:
            rep = runner.diff(pathlib.Path(a["trace"]), pathlib.Path(b["trace"]), jp, mp if markdown else None)
        out = {"verdict": rep.get("verdict"), "summary": rep.get("summary"), "exit_code": rep.get("exit_code"),
               "groups": runner.scale_groups(rep), "report": str(jp)}
        if "error" in rep:
            out["error"] = rep["error"]
        if markdown and mp.exists():
            out["markdown"] = mp.read_text()
        return out

    def reference(self, compared):
        """The reference run: single rank (host DeepSpeed, else the newest compared release) or a release."""
        if self.args.reference_release:
            r = self.capture(self.args.reference_release, self.layout, self.cfg, "reference")
            desc = f"release {self.args.reference_release} (sp={self.layout.sp} dp={self.layout.dp})"
        else:
            rel = (compared[-1] if self.entry.kind == "emulation" else
                   self.host or max(compared, key=releases.version_key))
            r = self.capture(rel, runner.Layout(1, 1), runner.reference_config(self.cfg, self.layout), "reference")
            desc = f"single rank, same global batch, deepspeed {rel}" + (" (emulated)" if
                                                                          self.entry.kind == "emulation" else "")
        if r["status"] != "ok":
            raise RunFailed(f"the reference run failed: {r.get('error')}")
        return r, desc


class RunFailed(Exception):
    pass


def last_error(log):
    try:
        lines = [l for l in pathlib.Path(log).read_text(errors="replace").splitlines() if l.strip()]
    except OSError:
        return "?"
    for l in reversed(lines):
        if "Error" in l or "error:" in l or "Exception" in l:
            return l.strip()[:240]
    return (lines[-1].strip() if lines else "no output")[:240]


def release_universe(args):
    if args.release_list:
        out = [check_release(v.strip(), "--release-list") for v in args.release_list.split(",") if v.strip()]
        return sorted(set(out), key=releases.version_key)
    return releases.published(releases.load_pypi(args.cache_dir, args.refresh_releases))


def row_of(run, ref, study, prev=None):
    row = {k: run.get(k) for k in ("release", "status", "error", "loss", "grad_norm", "seconds", "cached",
                                   "python", "trace", "log")}
    if run["status"] == "ok":
        row["vs_reference"] = study.compare(ref, run)
        if prev is not None:
            row["vs_previous"] = dict(study.compare(prev, run), previous=prev["release"])
    return row


def progress(i, n, release):
    print(f"[{i}/{n}] deepspeed {release}", file=sys.stderr, flush=True)


def compare_list(study, todo):
    n = len(todo)
    runs = []
    for i, rel in enumerate(todo, 1):
        progress(i, n, rel)
        runs.append(study.capture(rel, study.layout, study.cfg, f"[{i}/{n}]"))
    if not any(r["status"] == "ok" for r in runs):  # nothing to compare: no reference run either
        return {"rows": [row_of(r, None, study) for r in runs], "reference": "not run (no release ran)"}, 1
    ref, desc = study.reference(todo)
    rows, prev = [], None
    for run in runs:
        rows.append(row_of(run, ref, study, prev))
        if run["status"] == "ok":
            prev = run
    result = {"rows": rows, "reference": desc}
    ts = report.transitions(rows)
    if ts:
        a, b = ts[0]
        ra = next(r for r in runs if r["release"] == a)
        rb = next(r for r in runs if r["release"] == b)
        result["transition"] = {"from": a, "to": b, "markdown": study.compare(ra, rb, markdown=True).get("markdown")}
    differs = any(r["status"] != "ok" or r["vs_reference"].get("verdict") != "match" for r in rows) or bool(ts)
    return result, 1 if differs else 0


def run_bisect(study, good, bad, universe):
    cands = releases.between(universe, good, bad)
    for v in (good, bad):
        if v not in cands:
            cands = sorted(set(cands) | {v}, key=releases.version_key)
    print(f"bisect: {len(cands) - 2} releases between {good} and {bad}, about "
          f"{max(1, (len(cands) - 2).bit_length())} runs", file=sys.stderr, flush=True)
    # A GOOD that does not run (e.g. a release before the entry point's API existed) is skipped: the first
    # release after it that runs is the good end.
    unrunnable = []
    while True:
        g = study.capture(cands[0], study.layout, study.cfg, "GOOD")
        if g["status"] == "ok":
            break
        unrunnable.append(cands.pop(0))
        print(f"bisect: GOOD {g['release']} did not run; trying {cands[0]} as GOOD", file=sys.stderr, flush=True)
        if cands[0] == bad:
            raise RunFailed(f"no release from {good} up to {bad} ran: {g.get('error')}")
    good = cands[0]
    b = study.capture(bad, study.layout, study.cfg, "BAD")
    if b["status"] != "ok":
        raise RunFailed(f"BAD release {bad} did not run: {b.get('error')}")
    if study.compare(g, b)["verdict"] == "match":
        raise RunFailed(f"GOOD {good} and BAD {bad} give the same gradients: nothing to bisect")
    runs = {good: g, bad: b}
    step = [0]

    def verdict(rel):
        step[0] += 1
        print(f"[bisect step {step[0]}] deepspeed {rel}", file=sys.stderr, flush=True)
        r = study.capture(rel, study.layout, study.cfg, f"[step {step[0]}]")
        runs[rel] = r
        if r["status"] != "ok":
            return "skip"
        return "good" if study.compare(g, r)["verdict"] == "match" else "bad"

    found = bisect_mod.bisect(cands, verdict)
    ref, desc = study.reference([good, bad])
    order = sorted(runs, key=releases.version_key)
    rows = []
    for rel in order:
        run = runs[rel]
        row = row_of(run, ref, study, g if rel != good else None)
        if row.get("vs_previous"):
            row["vs_previous"]["previous"] = good
        rows.append(row)
    result = {"rows": rows, "reference": desc,
              "bisect": {"good": good, "bad": bad, "candidates": cands, "unrunnable_before_good": unrunnable, **found,
                         "visited": [list(v) for v in found["visited"]]}}
    lg, fb = found["last_good"], found["first_bad_or_skipped"]
    result["transition"] = {"from": lg, "to": fb,
                            "markdown": study.compare(runs[lg], runs[fb], markdown=True).get("markdown")}
    return result, 0 if found["first_bad"] else 1


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    t0 = time.time()
    try:
        cfg = load_config(args.config)
        study = Study(args, cfg)
        if args.reference_release:
            check_release(args.reference_release, "--reference-release")
        if args.bisect:
            good, bad = (check_release(v, "--bisect") for v in args.bisect)
            if releases.version_key(good) >= releases.version_key(bad):
                raise BadInput(f"--bisect {good} {bad}: GOOD must be older than BAD")
            result, rc = run_bisect(study, good, bad, release_universe(args))
        else:
            if args.releases:
                todo = [check_release(v.strip(), "--releases") for v in args.releases.split(",") if v.strip()]
            else:
                lo, hi = check_release(args.range_from, "--from"), check_release(args.range_to, "--to")
                todo = releases.between(release_universe(args), lo, hi)
            if not todo:
                raise BadInput("no releases to compare")
            result, rc = compare_list(study, todo)
    except BadInput as e:
        print(f"gradtrace-deepspeed-versions: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"gradtrace-deepspeed-versions: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # e.g. PyPI unreachable with no cached list
        print(f"gradtrace-deepspeed-versions: {e}", file=sys.stderr)
        return 2
    entry = (f"--script {study.entry.name}" if study.entry.kind == "script" else
             "gradtrace-train emulation" if study.entry.kind == "emulation" else f"--model {study.entry.name}")
    result["setup"] = {"command": "gradtrace-deepspeed-versions " + " ".join(shlex.quote(a) for a in argv),
                       "entry": entry, "sp": args.sp, "dp": args.dp, "loss": args.loss, "config": cfg,
                       "reference": result["reference"]}
    result["runs_executed"] = study.runs_executed
    result["exit_code"] = rc
    print(report.text_table(result["rows"]))
    print()
    print(report.conclusion(result).replace("**", ""))
    tr = result.get("transition")
    if tr and tr.get("markdown"):
        print(f"\ngradtrace-diff {tr['from']} {tr['to']}:\n{tr['markdown'].rstrip()}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1) + "\n")
    if args.markdown:
        args.markdown.write_text(report.markdown(result))
    print(f"done: {len(result['rows'])} releases, {study.runs_executed} runs executed "
          f"({sum(1 for r in result['rows'] if r.get('cached'))} rows from the cache), "
          f"{time.time() - t0:.0f} s", file=sys.stderr)
    return rc


if __name__ == "__main__":
    sys.exit(main())
