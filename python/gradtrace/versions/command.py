"""gradtrace-versions: run one training entry point under several releases of a package (any PyPI
distribution: deepspeed, transformers, accelerate, torchmetrics, ...), capture each, and say which release
changed the gradients the optimizer receives.

    gradtrace-versions --package torchmetrics --script train.py --bisect 1.3.1 1.4.1
    gradtrace-versions --package torchmetrics --script train.py --transitions 1.0.0 1.6.0 --markdown log.md
    gradtrace-versions --package pytorch-msssim --script train.py --releases 0.1.5,0.2.0,1.0.0 --markdown r.md
    gradtrace-versions --package deepspeed --config ds.json --model ds5248 --sp 2 --releases 0.11.1,0.11.2
    gradtrace-deepspeed-versions --config ds.json --script train.py --dp 2 --sp 1 --bisect 0.16.4 0.18.3

What differs between packages is each package's description (gradtrace/versions/packages/NAME.json: defaults,
environments, run variables, built-in loops); a package without one gets the defaults below. An alias a
description names is that package's command (`gradtrace-deepspeed-versions ...` is `gradtrace-versions
--package deepspeed ...`). For each release it
creates (or reuses) a Python environment with that release over a shared base (gradtrace.versions.envs; the
release the host has installed runs in the host interpreter), runs the entry point on CPU with sp x dp ranks
(gloo), each capturing with a gradtrace adapter, and compares the FINAL gradients of optimizer step 0 with
`gradtrace-diff --json` against the reference and against the previous release. It prints a table (release
-> scale and residual per parameter group, loss, the grad norm the framework reported), the first release
at which anything changed, and gradtrace-diff's report of that transition. Results are cached
(--cache-dir): a second call with the same package, release, config, entry point, layout and reference
runs nothing.

Reference (--reference): `first` (the default unless a description says otherwise) is the oldest release
compared (GOOD for --bisect); `single-rank` (DeepSpeed's default) runs the entry point on one rank over the
same global batch with the host's release, or the newest compared when the host has none (the description
says how the config follows: for DeepSpeed the micro-batch is multiplied by dp and train_batch_size dropped);
`--reference-release X` takes release X (same layout).

Built-in loops (--model NAME, DeepSpeed's: ds5248, moe) and --emulation come from a description. The loops are
studies and live in a gradtrace source checkout (tools/repro), not in the wheel: the checkout this package was
built in is found by itself; elsewhere give --checkout DIR.

--bisect GOOD BAD: binary search over the published releases between GOOD and BAD (PyPI; yanked and
pre-releases skipped, post releases kept) for the first release whose gradients differ from GOOD's; a release
whose env or run fails is skipped as in `git bisect skip`. Only the visited releases' envs are built.

--transitions GOOD BAD: every release whose gradients differ from the release before it, not only the first.
The range is probed every --probe-every K releases (default 4), then each range whose two ends differ is split at
its middle until the change sits between two neighbours (about n/K + k x log2(K) runs for k changes in n
releases, the cache reused); a range whose ends agree is not entered, so a change undone within fewer than K
releases can be missed (the report lists those ranges). The report is a changelog of the
gradients: per transition the release before and after (a range next to failed releases), the factor per
parameter group, the diff's cause, and the command that reproduces it (--releases BEFORE,AFTER); then the runs
made beside a sweep's count. The JSON follows gradtrace/versions/result.schema.json.

Script contract (--script PATH): the command starts PATH once per rank with the release's interpreter, as
`python PATH [--script-arg ...]`, with this environment:
    RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, MASTER_PORT  torch.distributed's env://
    OMP_NUM_THREADS=1, and the description's run variables (DeepSpeed: DS_ACCELERATOR=cpu, LOCAL_SIZE)
    GRADTRACE_OUT_DIR            the trace directory: give it to gradtrace.attach(model or engine or trainer,
                                 os.environ["GRADTRACE_OUT_DIR"], ...)
    GRADTRACE_PACKAGE, GRADTRACE_RELEASE   the package (normalised name) and the release under test
    GRADTRACE_CONFIG             --config's file (a copy), when given; also under the description's name for
                                 it (DeepSpeed: GRADTRACE_DS_CONFIG), for the single-rank reference with
                                 micro-batch x dp and no train_batch_size
    GRADTRACE_SP, GRADTRACE_DP   this run's layout (1 and 1 for a single-rank reference, which must train
                                 on the same global batch: the rows the dp ranks hold together)
    GRADTRACE_DEEPSPEED_RELEASE  (DeepSpeed: its description's name for GRADTRACE_RELEASE)
    PYTHONPATH                   this gradtrace package first
The script builds the same weights and data whatever the release and layout (seeded), captures into
GRADTRACE_OUT_DIR from before the first backward through at least one optimizer step (FINAL of step 0 is
what is compared; record_step(loss, ...) after each backward gives the table its loss), closes the capture,
and exits 0 on every rank; a non-zero exit marks the release failed (skipped by --bisect). Anything it
prints goes to the run's log. The package must reach the gradient (a loss, a layer, a reduction it
computes): what changes only a logged value is, rightly, no difference.

Exit status: 0 every release ran and its gradients match the reference; 1 a release differs from the
reference or from its predecessor, or failed (bisect: 1 when no single first bad release could be named);
2 bad input (one line on stderr naming what is wrong).
"""

import argparse
import json
import os
import pathlib
import shlex
import sys
import time

from gradtrace.versions import bisection as bisect_mod
from gradtrace.versions import cache as cache_mod
from gradtrace.versions import envs, packages, releases, report
from gradtrace.versions import transitions as transitions_mod
from gradtrace.versions.study import BadInput, RunFailed, Study

PROG = "gradtrace-versions"


def parse_args(argv, prog=PROG, package=None):
    """`package` set: a description's alias (gradtrace-deepspeed-versions), which takes no --package."""
    ap = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    if package is None:
        ap.add_argument("--package", required=True, help="the PyPI distribution whose releases are compared")
    ap.add_argument("--config", help="a config file for the entry point (JSON; required for DeepSpeed: its config)")
    what = ap.add_mutually_exclusive_group(required=True)
    what.add_argument("--script", help="your training script (see the script contract above)")
    loops = "; ".join(f"{name} ({d.display_name}): {loop['help']}" for d in packages.described()
                      for name, loop in d["loops"].items())
    what.add_argument("--model", choices=packages.loop_names(), help=f"a built-in entry point: {loops}")
    what.add_argument("--emulation", action="store_true",
                      help="the package's emulation, without environments (DeepSpeed: each release is "
                           "gradtrace-train --scaling deepspeed@RELEASE, its C++ emulation of that release's "
                           "reduction; needs gradtrace-train)")
    ap.add_argument("--checkout", type=pathlib.Path,
                    help="a gradtrace source checkout, whose tools/repro holds the built-in loops (default: the "
                         "checkout this package was built in, when it was)")
    ap.add_argument("--script-arg", action="append", default=[], help="an argument for --script (repeatable)")
    ap.add_argument("--sp", type=int, help="Ulysses sequence-parallel size (default 2 for DeepSpeed, else 1)")
    ap.add_argument("--dp", type=int, default=1, help="data-parallel size (default 1)")
    ap.add_argument("--loss", default="loss", choices=["loss", "loss-div-sp", "token-weighted",
                                                       "global-token-weighted", "full-sequence"],
                    help="the built-in loop's loss recipe (default: loss, the #5248 issue's loop)")
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--releases", help="comma-separated releases, compared in the order given")
    which.add_argument("--from", dest="range_from", help="first release of a range (with --to)")
    which.add_argument("--bisect", nargs=2, metavar=("GOOD", "BAD"), help="find the first bad release")
    which.add_argument("--transitions", nargs=2, metavar=("GOOD", "BAD"),
                       help="find every release whose gradients differ from the release before it: probe every "
                            "--probe-every releases, then split each range whose ends differ")
    ap.add_argument("--probe-every", type=int, default=4, metavar="K",
                    help="--transitions: probe every K-th release before splitting (default 4); a change undone "
                         "within fewer than K releases can fall between two probes that agree")
    ap.add_argument("--to", dest="range_to", help="last release of a range (with --from)")
    ap.add_argument("--release-list", help="comma-separated release list used for --from/--to and --bisect "
                                           "instead of PyPI's published releases")
    ap.add_argument("--reference", choices=["single-rank", "first"],
                    help="single-rank (DeepSpeed's default) or first (the oldest release compared; the default "
                         "for other packages)")
    ap.add_argument("--reference-release", help="take this release (same layout) as the reference")
    ap.add_argument("--deps", choices=["resolve", "none"],
                    help="what a release's environment gets besides the release: resolve (default; what the base "
                         "lacks or the release refuses, torch held at the base's) or none (DeepSpeed's way)")
    own = {"environments": [], "cache": []}
    for d in packages.described():
        for section, folders in own.items():
            folders.append(f"{d.display_name}'s {d.root(section)}")
    ap.add_argument("--env-root", type=pathlib.Path, help="where the per-release environments live (default "
                    f"{packages.DEFAULTS['environments']['root']}; {', '.join(own['environments'])})")
    ap.add_argument("--cache-dir", type=pathlib.Path, help=f"results cache (default "
                    f"{packages.DEFAULTS['cache']['root']}; {', '.join(own['cache'])})")
    ap.add_argument("--no-build", action="store_true", help="never create an environment (missing: run fails)")
    ap.add_argument("--rerun", action="store_true", help="ignore cached results (and replace them)")
    ap.add_argument("--rerun-failed", action="store_true", help="run again the releases whose cached run failed")
    ap.add_argument("--refresh-releases", action="store_true", help="re-read PyPI's release list now")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per run (default 900)")
    ap.add_argument("--json", type=pathlib.Path, help="write every result to this JSON file")
    ap.add_argument("--markdown", type=pathlib.Path, help="write the Markdown report to this file")
    args = ap.parse_args(argv)
    if package is not None:
        args.package = package
    if (args.range_from is None) != (args.range_to is None):
        ap.error("--from and --to go together")
    return args


def settle(args):
    """Fill the per-package defaults (its description's) and check what argparse cannot; BadInput names the
    first problem."""
    if not releases.valid_name(args.package):
        raise BadInput(f"--package {args.package!r}: not a PyPI distribution name")
    desc = packages.describe(args.package)
    if args.model and args.model not in desc["loops"]:
        raise BadInput(f"--model is {packages.owner_of('loops', args.model)}'s; for {args.package} give --script")
    if args.emulation and not desc["emulation"]:
        raise BadInput(f"--emulation is {packages.owner_of('emulation')}'s; for {args.package} give --script")
    if desc["config"]["required"] and not args.config:
        raise BadInput(f"--config: {desc.display_name} needs its config (JSON file)")
    defaults = desc["defaults"]
    args.sp = args.sp if args.sp is not None else defaults["sp"]
    if args.sp < 1 or args.dp < 1:
        raise BadInput(f"--sp {args.sp} --dp {args.dp}: both must be >= 1")
    args.reference = args.reference or defaults["reference"]
    args.deps = args.deps or defaults["deps"]
    if args.deps not in desc["deps_allowed"]:
        raise BadInput(f"--deps {args.deps}: {desc.display_name}'s environments take --deps "
                       f"{' or '.join(desc['deps_allowed'])}")
    args.env_root = args.env_root or envs.default_root(args.package)
    args.cache_dir = args.cache_dir or cache_mod.default_root(args.package)


def load_config(path):
    if path is None:
        return None
    try:
        cfg = json.loads(pathlib.Path(path).read_text())
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: not a readable JSON config ({e})") from None
    if not isinstance(cfg, dict):
        raise BadInput(f"{path}: a config is a JSON object")
    return cfg


def check_release(v, what):
    try:
        releases.version_key(v)
    except ValueError:
        raise BadInput(f"{what}: {v!r} is not a release number (e.g. 0.14.3)") from None
    return v


def release_universe(args):
    if args.release_list:
        out = [check_release(v.strip(), "--release-list") for v in args.release_list.split(",") if v.strip()]
        return sorted(set(out), key=releases.version_key)
    return releases.published(releases.load_pypi(args.package, args.cache_dir, args.refresh_releases))


def row_of(run, ref, study, prev=None):
    row = {k: run.get(k) for k in ("release", "status", "error", "loss", "grad_norm", "seconds", "cached",
                                   "python", "trace", "log")}
    if run["status"] == "ok":
        row["vs_reference"] = study.compare(ref, run)
        if prev is not None:
            row["vs_previous"] = dict(study.compare(prev, run), previous=prev["release"])
    return row


def progress(study, i, n, release):
    print(f"[{i}/{n}] {study.package} {release}", file=sys.stderr, flush=True)


def compare_list(study, todo):
    n = len(todo)
    runs = []
    for i, rel in enumerate(todo, 1):
        progress(study, i, n, rel)
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
    ends = study.compare(g, b)
    if ends.get("error"):
        raise RunFailed(f"GOOD {good} and BAD {bad} could not be compared (the diff failed: {ends['error']}): "
                        "nothing to bisect")
    if ends["verdict"] == "match":
        raise RunFailed(f"GOOD {good} and BAD {bad} give the same gradients: nothing to bisect")
    runs = {good: g, bad: b}
    step = [0]

    def verdict(rel):
        step[0] += 1
        print(f"[bisect step {step[0]}] {study.package} {rel}", file=sys.stderr, flush=True)
        r = study.capture(rel, study.layout, study.cfg, f"[step {step[0]}]")
        runs[rel] = r
        if r["status"] != "ok":
            return "skip"
        cmp = study.compare(g, r)
        if cmp.get("error"):  # nothing measured: neither good nor bad
            return "skip"
        return "good" if cmp["verdict"] == "match" else "bad"

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


def ends_that_run(study, cands):
    """GOOD and BAD as given, or the nearest releases inward that run (a GOOD before the entry point's API existed,
    a BAD that fails): (runs by release, the candidates left, the releases that did not run at either end)."""
    runs, unrunnable = {}, []
    for end, label in ((0, "GOOD"), (-1, "BAD")):
        while True:
            r = study.capture(cands[end], study.layout, study.cfg, label)
            runs[cands[end]] = r
            if r["status"] == "ok":
                break
            unrunnable.append(cands.pop(end))
            if len(cands) < 2:
                raise RunFailed(f"fewer than two releases in the range ran: {r.get('error')}")
            print(f"transitions: {label} {r['release']} did not run; trying {cands[end]}", file=sys.stderr, flush=True)
    return runs, cands, sorted(unrunnable, key=releases.version_key)


def run_transitions(study, good, bad, universe, reproduce):
    """--transitions GOOD BAD: every change (transitions.find), each with its factors, causes and the command that
    reproduces it (`reproduce(releases)`), the runs made and the sweep's count beside them."""
    cands = releases.between(universe, good, bad)
    cands = sorted(set(cands) | {good, bad}, key=releases.version_key)
    n = len(cands)
    print(f"transitions: {n} releases from {good} to {bad} (a sweep runs {n}); each range whose ends differ is split",
          file=sys.stderr, flush=True)
    runs, cands, unrunnable = ends_that_run(study, cands)
    step = [0]

    def ran(rel):
        step[0] += 1
        print(f"[probe {step[0]}] {study.package} {rel}", file=sys.stderr, flush=True)
        runs[rel] = study.capture(rel, study.layout, study.cfg, f"[probe {step[0]}]")
        return runs[rel]["status"] == "ok"

    def compare(a, b):
        cmp = study.compare(runs[a], runs[b])
        return "not-compared" if cmp.get("error") else "same" if cmp["verdict"] == "match" else "changed"

    found = transitions_mod.find(cands, ran, compare, study.args.probe_every)
    ref, desc = study.reference([cands[0], cands[-1]])
    rows, prev = [], None
    for rel in sorted(runs, key=releases.version_key):
        rows.append(row_of(runs[rel], ref, study, prev))
        if runs[rel]["status"] == "ok":
            prev = runs[rel]
    changes = []
    for a, b, between in found["changes"]:
        cmp = study.compare(runs[a], runs[b], markdown=True)
        changes.append({"before": a, "after": b, "failed_between": between, "verdict": cmp["verdict"],
                        "summary": cmp["summary"], "groups": cmp["groups"], "report": cmp["report"],
                        "markdown": cmp.get("markdown"), "command": reproduce([a, *between, b])})
    result = {"rows": rows, "reference": desc, "transitions": {
        "good": cands[0], "bad": cands[-1], "candidates": cands, "unrunnable_ends": unrunnable,
        "changes": changes,
        "not_compared": [{"before": a, "after": b, "failed_between": f, "command": reproduce([a, *f, b])}
                         for a, b, f in found["not_compared"]],
        "unentered": [list(p) for p in found["unentered"]], "failed": found["failed"],
        "runs": len(runs), "sweep_runs": n, "every": study.args.probe_every}}
    rc = 1 if changes or found["not_compared"] or found["failed"] or unrunnable else 0
    return result, rc


def main(argv=None, prog=PROG, package=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv, prog, package)
    t0 = time.time()
    try:
        settle(args)
        cfg = load_config(args.config)
        study = Study(args, cfg)
        if args.reference_release:
            check_release(args.reference_release, "--reference-release")
        if args.bisect:
            good, bad = (check_release(v, "--bisect") for v in args.bisect)
            if releases.version_key(good) >= releases.version_key(bad):
                raise BadInput(f"--bisect {good} {bad}: GOOD must be older than BAD")
            result, rc = run_bisect(study, good, bad, release_universe(args))
        elif args.transitions:
            good, bad = (check_release(v, "--transitions") for v in args.transitions)
            if releases.version_key(good) >= releases.version_key(bad):
                raise BadInput(f"--transitions {good} {bad}: GOOD must be older than BAD")
            if args.probe_every < 1:
                raise BadInput(f"--probe-every {args.probe_every}: expected an integer >= 1")
            result, rc = run_transitions(study, good, bad, release_universe(args),
                                         lambda rels: reproduce_command(prog, argv, rels))
        else:
            if args.releases is not None:  # given, even as '' (issue 42: a traceback before)
                todo = [check_release(v.strip(), "--releases") for v in args.releases.split(",") if v.strip()]
                if not todo:
                    raise BadInput(f"--releases {args.releases!r}: no release given (e.g. --releases 1.3.1,1.4.0)")
            else:
                lo, hi = check_release(args.range_from, "--from"), check_release(args.range_to, "--to")
                todo = releases.between(release_universe(args), lo, hi)
            if not todo:
                raise BadInput("no releases to compare")
            result, rc = compare_list(study, todo)
    except BadInput as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    except RunFailed as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 1
    except RuntimeError as e:  # e.g. PyPI unreachable with no cached list
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    entry = (f"--script {study.entry.name}" if study.entry.kind == "script" else
             "gradtrace-train emulation" if study.entry.kind == "emulation" else f"--model {study.entry.name}")
    desc = packages.describe(args.package)
    result["setup"] = {"command": f"{prog} " + " ".join(shlex.quote(a) for a in argv), "package": args.package,
                       "display_name": desc.display_name, "config_title": desc["config"]["title"],
                       "entry": entry, "sp": args.sp, "dp": args.dp, "loss": args.loss, "config": cfg,
                       "deps": args.deps, "reference": result["reference"]}
    result["runs_executed"] = study.runs_executed
    result["exit_code"] = rc
    print(report.text_table(result["rows"], report.against(result)))
    print()
    print(report.conclusion(result).replace("**", ""))
    if result.get("transitions"):
        print()
        print(report.changelog_text(result["transitions"]))
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


def reproduce_command(prog, argv, rels) -> str:
    """This command with --transitions GOOD BAD replaced by --releases R1,R2,... (the transition's releases) and
    without its output files: what reproduces one transition."""
    out, skip = [], 0
    for a in argv:
        if skip:
            skip -= 1
        elif a == "--transitions":
            skip = 2
        elif a == "--probe-every":
            skip = 1
        elif a in ("--json", "--markdown"):
            skip = 1
        elif not a.startswith(("--json=", "--markdown=", "--transitions=", "--probe-every=")):
            out.append(a)
    return f"{prog} " + " ".join(shlex.quote(a) for a in [*out, "--releases", ",".join(rels)])


def alias_main(argv=None, prog=None):
    """A description's alias command (gradtrace-deepspeed-versions): `gradtrace-versions --package NAME`, the
    package being the one whose description names this program."""
    prog = prog or os.path.basename(sys.argv[0])
    package = packages.by_alias(prog)
    if package is None:
        print(f"{prog}: no package description names this command as its alias", file=sys.stderr)
        return 2
    return main(argv, prog=prog, package=package)


if __name__ == "__main__":
    sys.exit(main())
