#!/usr/bin/env python3
"""The #5248 study's DeepSpeed releases and their environments: a thin wrapper over the package's
gradtrace.versions.envs with DeepSpeed's description (the one implementation, also used by gradtrace-versions).

    .venv/bin/python tools/repro/ds5248/envs.py                 # create every environment (idempotent)
    .venv/bin/python tools/repro/ds5248/envs.py 0.13.0 0.13.1   # only these
    .venv/bin/python tools/repro/ds5248/envs.py --list          # version -> interpreter, no changes
    .venv/bin/python tools/repro/ds5248/envs.py --check         # import test of each existing environment

It needs the built gradtrace package (.venv finds it through tools/setup's .pth file; elsewhere
PYTHONPATH=build/python and an interpreter with numpy). The environments live in the package's env root
(~/.cache/gradtrace/deepspeed-envs, or $GRADTRACE_DS_ENVS): a shared torch-2.1.2 base and one ds-<version>
venv per release; the pins and why they are what they are: python/gradtrace/versions/packages/deepspeed.json.
The newest release (0.19.8) runs in the project's own .venv (torch 2.15.0, tools/constraints.txt).
"""

import argparse
import os
import pathlib
import subprocess
import sys

from gradtrace.versions import envs as package_envs

ROOT = pathlib.Path(__file__).resolve().parents[3]

# The releases of the #5248 study (docs/studies/ds5248.md).
VERSIONS = ("0.11.1",  # last release without PR #4530's SP divisor
            "0.11.2",  # first release with it
            "0.13.0",  # before PR #4957
            "0.13.1",  # after PR #4957 (divide=False)
            "0.14.5")  # one 0.14.x: DistributedAttention batch_dim_idx (micro-batch > 1) fixed
NEWEST = "0.19.8"


def python_of(version):
    """The interpreter that runs DeepSpeed `version` (it may not exist yet: create it with main())."""
    if version == NEWEST:
        return ROOT / ".venv" / "bin" / "python"
    return package_envs.default_root("deepspeed") / f"ds-{version}" / "bin" / "python"


def check(version):
    py = python_of(version)
    code = ("import os; os.environ.setdefault('DS_ACCELERATOR', 'cpu'); import torch, deepspeed, pydantic, numpy; "
            "print(deepspeed.__version__, torch.__version__, pydantic.VERSION, numpy.__version__)")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    ok = out.returncode == 0 and out.stdout.strip()
    line = out.stdout.strip().splitlines()[-1] if ok else f"FAILED: {out.stderr[-300:]}"
    print(f"{version:8s} {py}: {line}")
    return bool(ok) and line.startswith(version + " ")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("versions", nargs="*", help=f"default: all of {', '.join(VERSIONS)}")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    versions = args.versions or list(VERSIONS)
    if args.list:
        for v in versions + ([NEWEST] if not args.versions else []):
            print(f"{v:8s} {python_of(v)}")
        return 0
    if not args.check:
        for v in versions:
            if v != NEWEST:
                try:
                    package_envs.python_of("deepspeed", v)
                except package_envs.EnvError as e:
                    print(f"{v}: {e}", file=sys.stderr)
    return 0 if all([check(v) for v in versions]) else 1


if __name__ == "__main__":
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    sys.exit(main())
