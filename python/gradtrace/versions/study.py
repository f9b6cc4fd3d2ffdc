"""One invocation of gradtrace-versions: its runs (cached), their diffs (cached), the reference run and the
rows of the table. command.py decides which releases to run; this runs them."""

import hashlib
import json
import pathlib
import sys
import time

from gradtrace.versions import cache as cache_mod
from gradtrace.versions import envs, packages, releases, runner


class BadInput(Exception):
    pass


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


def single_rank_config(cfg, dp: int, rule: dict):
    """The single-rank reference's config, by the description's rule: one rank takes the global batch (the keys
    of rule["multiply_by_dp"] times dp) and the keys of rule["drop"] go (DeepSpeed derives train_batch_size
    for world 1)."""
    if cfg is None:
        return None
    ref = json.loads(json.dumps(cfg))
    for k in rule["multiply_by_dp"]:
        ref[k] = int(cfg.get(k, 1)) * dp
    for k in rule["drop"]:
        ref.pop(k, None)
    return ref


class Study:
    """The runs of one package under one entry point, layout and config."""

    def __init__(self, args, cfg):
        self.args, self.cfg = args, cfg
        self.package = args.package
        self.desc = packages.describe(args.package)
        self.cache = cache_mod.Cache(args.cache_dir)
        if args.script:
            script = pathlib.Path(args.script)
            if not script.is_file():
                raise BadInput(f"{script}: no such script")
            self.entry = runner.Entry("script", str(script.resolve()), tuple(args.script_arg), args.loss,
                                      files=(str(script.resolve()),))
        elif args.emulation:
            self.entry = runner.Entry("emulation", "gradtrace-train", (), args.loss)
        else:
            self.entry = self.loop_entry(args.model, args.loss, getattr(args, "checkout", None))
        self.layout = runner.Layout(args.sp, args.dp)
        self.digest = self.entry.digest()
        self.runs_executed = 0
        self.host = envs.host_version(args.package)

    def loop_entry(self, name, loss, checkout):
        """The description's built-in loop `name`, found in a gradtrace source checkout (BadInput when none)."""
        loop = self.desc["loops"][name]
        root = runner.find_checkout(loop["script"], checkout)
        if root is None:
            where = (f"--checkout {checkout} has none" if checkout else
                     f"no checkout was found above this package ({runner.PACKAGE_PARENT})")
            raise BadInput(f"--model {name}: {self.desc.display_name}'s built-in loop is {loop['script']} in a gradtrace "
                           f"source checkout, not part of the installed package, and {where} (give --checkout DIR, or "
                           "--script)")
        files = [root / f for f in loop.get("sources", ())] + runner.module_files(loop.get("package_sources", ()))
        return runner.Entry("model", name, (), loss, files=tuple(map(str, files)), target=str(root / loop["script"]),
                            target_args=tuple(loop.get("args", ())))

    def cfg_hash(self, cfg):
        return hashlib.sha256(json.dumps(cfg, sort_keys=True).encode()).hexdigest()[:16]

    def key(self, release, layout, cfg):
        parts = dict(release=release, config=self.cfg_hash(cfg), entry=self.digest, layout=layout.text(),
                     kind=self.entry.kind)
        if self.desc["cache"]["key_names_package"]:  # false: keys as gradtrace-deepspeed-versions wrote them
            parts.update(package=releases.normalize_name(self.package), deps=self.args.deps)
        return cache_mod.key(**parts)

    def capture(self, release, layout, cfg, label):
        """A finished run of `release` (from the cache or run now): its result dict with key and trace."""
        k = self.key(release, layout, cfg)
        got = None if self.args.rerun else self.cache.load(k)
        if got is not None and got["status"] != "ok" and self.args.rerun_failed:
            got = None
        if got is not None:
            got["cached"] = True
            return got
        d = self.cache.run_dir(k)
        d.mkdir(parents=True, exist_ok=True)
        config_path = None
        if cfg is not None:
            config_path = d / "config.json"
            config_path.write_text(json.dumps(cfg, indent=1))
        t0 = time.time()
        res = {"key": k, "release": release, "trace": str(d / "trace"), "log": str(d / "run.log"), "cached": False}
        try:
            python = (sys.executable if self.entry.kind == "emulation" else
                      envs.python_of(self.package, release, self.args.env_root, build=not self.args.no_build,
                                     log=d / "env.log", deps=self.args.deps))
            res["python"] = str(python)
            res["env_seconds"] = round(time.time() - t0, 1)
            t1 = time.time()
            self.runs_executed += 1
            rc = runner.run(self.entry, python, config_path, layout, d / "trace", d / "run.log", self.desc, release,
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
        print(f"  {label}: {self.package} {release} {res['status']} in {res['seconds']:.0f} s"
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
        """The reference run: `--reference-release X`; `first`, the oldest release compared; `single-rank`, one
        rank over the same global batch with the host's release (else the newest compared)."""
        if self.args.reference_release or self.args.reference == "first":
            rel = self.args.reference_release or min(compared, key=releases.version_key)
            r = self.capture(rel, self.layout, self.cfg, "reference")
            desc = f"release {rel} (sp={self.layout.sp} dp={self.layout.dp})"
        else:
            rel = (compared[-1] if self.entry.kind == "emulation" else
                   self.host or max(compared, key=releases.version_key))
            cfg = single_rank_config(self.cfg, self.layout.dp, self.desc["single_rank_reference"])
            r = self.capture(rel, runner.Layout(1, 1), cfg, "reference")
            desc = f"single rank, same global batch, {self.package} {rel}" + (
                " (emulated)" if self.entry.kind == "emulation" else "")
        if r["status"] != "ok":
            raise RunFailed(f"the reference run failed: {r.get('error')}")
        return r, desc
