#!/usr/bin/env python3
"""Pinned Python environments for the old DeepSpeed releases of the #5248 matrix.

    python3 tools/repro/ds5248/envs.py                 # create every environment (idempotent)
    python3 tools/repro/ds5248/envs.py 0.13.0 0.13.1   # only these
    python3 tools/repro/ds5248/envs.py --list          # version -> interpreter, no changes
    python3 tools/repro/ds5248/envs.py --check         # import test of each existing environment

Layout (all under /.venvs/, which git ignores):

    .venvs/torch-2.1.2/     the shared base: torch 2.1.2 + numpy 1.x + pydantic 1.10 + DeepSpeed's
                            pure-Python dependencies, exactly as pinned in pins/base-torch-2.1.2.txt
    .venvs/ds-<version>/    one venv per DeepSpeed release: only `deepspeed==<version>` (pure Python,
                            DS_BUILD_OPS=0, installed with --no-deps from pins/ds-<version>.txt) and a
                            .pth file that appends the base's site-packages to sys.path

So the DeepSpeed release is the only thing that differs between the old versions' runs (one torch,
one pydantic, one numpy), and the ~2.5 GB torch wheel with its CUDA libraries is installed once. The
newest release (0.19.8) runs in the project's own .venv (torch 2.15.0, tools/constraints.txt); it has
no entry here.

Why these pins (checked against each release's requirements/requirements.txt):
- torch 2.1.2 (Dec 2023) was current when 0.11.x-0.13.x shipped and is supported by 0.14.5; it has
  cp311 wheels for the project's Python 3.11 (the _gtcodec bindings are built for 3.11).
- pydantic 1.10: 0.11.1 requires `pydantic<2.0.0`; 0.11.2+ accept 1 or 2 (deepspeed/pydantic_v1.py),
  so pydantic 1 serves all of them.
- numpy < 2: torch 2.1.2 was built against numpy 1.x.
- DeepSpeed < 0.15 selects its CPU accelerator only if intel_extension_for_pytorch imports, and its
  cpu_accelerator.py imports oneccl_bindings_for_pytorch; neither is used by these runs (gloo, no
  fused ops) and neither is installed, so cpu_shims/ holds import stubs,
  put on the old environments' sys.path by a .pth file.
- 0.13.0's setup.py imports torch, so its sdist only builds with --no-build-isolation (torch visible).
Every environment must be Python 3.11 (`python3` here is pyenv 3.11.7).
"""

import argparse
import os
import pathlib
import subprocess
import sys

HERE = pathlib.Path(__file__).resolve().parent
ROOT = HERE.parents[2]
PINS = HERE / "pins"
VENVS = ROOT / ".venvs"

# DeepSpeed version -> base environment (pins/base-<name>.txt). The newest release uses ROOT/.venv.
VERSIONS = {
    "0.11.1": "torch-2.1.2",  # last release without PR #4530's SP divisor
    "0.11.2": "torch-2.1.2",  # first release with it
    "0.13.0": "torch-2.1.2",  # before PR #4957
    "0.13.1": "torch-2.1.2",  # after PR #4957 (divide=False)
    "0.14.5": "torch-2.1.2",  # one 0.14.x: DistributedAttention batch_dim_idx (micro-batch > 1) fixed
}
NEWEST = "0.19.8"


def python_of(version):
    """The interpreter that runs DeepSpeed `version`."""
    if version == NEWEST:
        return ROOT / ".venv" / "bin" / "python"
    return VENVS / f"ds-{version}" / "bin" / "python"


def site_packages(venv):
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def sh(cmd, **kw):
    print("+", " ".join(map(str, cmd)), flush=True)
    subprocess.check_call([str(c) for c in cmd], **kw)


def make_venv(path, py):
    if not (path / "bin" / "python").exists():
        sh([py, "-m", "venv", path])
    v = subprocess.check_output([str(path / "bin" / "python"), "-c",
                                 "import sys; print('%d.%d' % sys.version_info[:2])"], text=True).strip()
    if v != "3.11":
        raise SystemExit(f"{path}: Python {v}; the gradtrace bindings (_gtcodec) are built for 3.11")


def ensure_base(name, py):
    base = VENVS / name
    stamp = base / ".gradtrace-pins"
    pins = PINS / f"base-{name}.txt"
    if stamp.exists() and stamp.read_text() == pins.read_text():
        return base
    make_venv(base, py)
    env = dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1")
    sh([base / "bin" / "pip", "install", "-q", "-r", pins], env=env)
    stamp.write_text(pins.read_text())
    return base


def ensure_version(version, py):
    base = ensure_base(VERSIONS[version], py)
    venv = VENVS / f"ds-{version}"
    pins = PINS / f"ds-{version}.txt"
    stamp = venv / ".gradtrace-pins"
    if stamp.exists() and stamp.read_text() == pins.read_text():
        return venv
    make_venv(venv, py)
    sp = site_packages(venv)
    # Appended to sys.path after the venv's own site-packages: deepspeed here wins, torch comes from base.
    (sp / "_gradtrace_base_env.pth").write_text(str(site_packages(base)) + "\n")
    # Import stubs for intel_extension_for_pytorch / oneccl_bindings_for_pytorch: DeepSpeed < 0.15 will not
    # select its CPU accelerator without them (cpu_shims/*/__init__.py say why that is safe here).
    (sp / "_gradtrace_cpu_shims.pth").write_text(str(HERE / "cpu_shims") + "\n")
    env = dict(os.environ, DS_BUILD_OPS="0", PIP_DISABLE_PIP_VERSION_CHECK="1")
    sh([venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-build-isolation", "-r", pins], env=env)
    stamp.write_text(pins.read_text())
    return venv


def check(version):
    py = python_of(version)
    code = ("import os; os.environ.setdefault('DS_ACCELERATOR', 'cpu'); import torch, deepspeed, pydantic, numpy; "
            "print(deepspeed.__version__, torch.__version__, pydantic.VERSION, numpy.__version__)")
    out = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    line = out.stdout.strip().splitlines()[-1] if out.returncode == 0 and out.stdout.strip() else f"FAILED: {out.stderr[-300:]}"
    print(f"{version:8s} {py}: {line}")
    return out.returncode == 0 and line.startswith(version + " ")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("versions", nargs="*", help=f"default: all of {', '.join(VERSIONS)}")
    ap.add_argument("--python", default="python3", help="a Python 3.11 interpreter to create the venvs with")
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args(argv)
    versions = args.versions or list(VERSIONS)
    for v in versions:
        if v not in VERSIONS and v != NEWEST:
            raise SystemExit(f"unknown version {v}; known: {', '.join(VERSIONS)}, {NEWEST}")
    if args.list:
        for v in versions + ([NEWEST] if not args.versions else []):
            print(f"{v:8s} {python_of(v)}")
        return 0
    if args.check:
        return 0 if all([check(v) for v in versions]) else 1
    for v in versions:
        if v != NEWEST:
            ensure_version(v, args.python)
    return 0 if all([check(v) for v in versions]) else 1


if __name__ == "__main__":
    sys.exit(main())
