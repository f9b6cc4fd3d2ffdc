"""One Python environment per DeepSpeed release, layered over a shared torch base (created on demand).

DeepSpeed's half of gradtrace-versions' environments (gradtrace.versions.envs builds every other
distribution's). Layout under the env root (default
~/.cache/gradtrace/deepspeed-envs, --env-root or $GRADTRACE_DS_ENVS):

    torch-2.1.2/      shared base: torch 2.1.2 + numpy 1.26 + pydantic 1.10 + DeepSpeed's pure-Python
                      dependencies, exactly BASE_PINS["torch-2.1.2"] (installed once, ~2.5 GB)
    ds-<version>/     only `deepspeed==<version>` (pure Python: DS_BUILD_OPS=0, --no-deps), plus .pth files
                      that append the base's site-packages (and, before 0.15, cpu_shims/) to sys.path
    cpu_shims/        import stubs for intel_extension_for_pytorch / oneccl_bindings_for_pytorch

The base of a release is torch_base_of (below): "torch-2.1.2" before 0.15, "host" (the
interpreter running the command, e.g. the project's .venv with torch 2.15.0 and pydantic 2) from 0.15 on.
A release equal to the host's installed DeepSpeed runs in the host interpreter itself, no env at all.
Every environment is the host's Python minor version (the _gtcodec extension is built for it).

Why these pins: torch 2.1.2 (Dec 2023) was current when 0.11.x-0.13.x shipped and is supported by 0.14.x;
deepspeed 0.11.1 requires pydantic<2 (0.11.2-0.14.x accept 1 or 2 through deepspeed/pydantic_v1.py);
numpy < 2 because torch 2.1.2 was built against numpy 1.x. DeepSpeed < 0.15 selects its CPU accelerator
only if intel_extension_for_pytorch imports, and its cpu_accelerator.py imports oneccl_bindings_for_pytorch;
neither is used by CPU/gloo runs without fused ops, so the stubs in cpu_shims/ satisfy the imports
(ds5248_run.gloo_for_stubbed_oneccl switches the backend to gloo when it sees the oneCCL stub).
0.13.0's setup.py imports torch, hence --no-build-isolation (the base is visible through the .pth).
"""

import os
import pathlib
import subprocess
import sys
import sysconfig

from gradtrace.versions.releases import version_key
from gradtrace.versions.venvs import EnvError, site_packages
from gradtrace.versions.venvs import locked as _locked, make_venv as _make_venv, quiet_env as _quiet_env, sh as _sh

DEFAULT_ROOT = pathlib.Path(os.environ.get("GRADTRACE_DS_ENVS", "~/.cache/gradtrace/deepspeed-envs")).expanduser()

BASE_PINS = {
    # Verified by pip freeze after install (Python 3.11); CUDA wheels from PyPI, nothing CUDA is used.
    "torch-2.1.2": """filelock==4.3.1
fsspec==2026.9.0
hjson==3.1.0
Jinja2==3.1.6
MarkupSafe==3.0.4
mpmath==1.3.0
networkx==3.6.1
ninja==1.13.2
numpy==1.26.4
nvidia-cublas-cu12==12.1.3.1
nvidia-cuda-cupti-cu12==12.1.105
nvidia-cuda-nvrtc-cu12==12.1.105
nvidia-cuda-runtime-cu12==12.1.105
nvidia-cudnn-cu12==8.9.2.26
nvidia-cufft-cu12==11.0.2.54
nvidia-curand-cu12==10.3.2.106
nvidia-cusolver-cu12==11.4.5.107
nvidia-cusparse-cu12==12.1.0.106
nvidia-ml-py==13.615.71
nvidia-nccl-cu12==2.18.1
nvidia-nvjitlink-cu12==12.9.86
nvidia-nvtx-cu12==12.1.105
packaging==26.4
psutil==7.2.2
py-cpuinfo==9.0.0
pydantic==1.10.27
sympy==1.14.0
torch==2.1.2
tqdm==4.70.1
triton==2.1.0
typing_extensions==4.16.0
wheel==0.48.0
""",
}

WHEEL_PIN = "wheel==0.48.0"

CPU_SHIMS = {
    "intel_extension_for_pytorch": '''"""Import stub (gradtrace dsversions_envs): DeepSpeed < 0.15 refuses
DS_ACCELERATOR=cpu unless intel_extension_for_pytorch imports (deepspeed/accelerator/real_accelerator.py);
its CPU accelerator uses nothing from it on CPU/gloo runs without fused ops (DS_BUILD_OPS=0)."""

__version__ = "0.0.0+gradtrace.stub"


class _C:  # real_accelerator's auto-detection asks ipex._C._has_xpu()
    @staticmethod
    def _has_xpu():
        return False
__gradtrace_stub__ = True
''',
    "oneccl_bindings_for_pytorch": '''"""Import stub (gradtrace dsversions_envs): DeepSpeed < 0.14 imports
oneccl_bindings_for_pytorch at the top of deepspeed/accelerator/cpu_accelerator.py; the runs initialise torch.distributed with gloo."""

__gradtrace_stub__ = True  # ds5248_run.gloo_for_stubbed_oneccl: with it the CPU accelerator uses gloo
''',
}


# The torch base a release runs on. "torch-2.1.2": the pinned base above (pydantic 1.10, numpy 1.26), what
# 0.11.x-0.14.x shipped against; "host": the interpreter running the command (the project's .venv: torch
# 2.15.0, pydantic 2). Evidence for the boundary, measured by building both sides of it:
# docs/deepspeed-versions/README.md ("Which torch each release runs on"); 0.15.0 needs pydantic 2.
HOST_FROM = "0.15.0"


def torch_base_of(version: str) -> str:
    return "torch-2.1.2" if version_key(version) < version_key(HOST_FROM) else "host"


def host_deepspeed_version():
    """The DeepSpeed release importable in this interpreter, or None (no import: metadata only)."""
    try:
        from importlib.metadata import PackageNotFoundError, version
        try:
            return version("deepspeed")
        except PackageNotFoundError:
            return None
    except ImportError:
        return None


def ensure_base(name: str, root: pathlib.Path, log) -> pathlib.Path:
    """The site-packages folder of base `name` (created when missing or when its pins changed)."""
    if name == "host":
        return pathlib.Path(sysconfig.get_paths()["purelib"])
    base = root / name
    stamp = base / ".gradtrace-pins"
    if stamp.exists() and stamp.read_text() == BASE_PINS[name]:
        return site_packages(base)
    with _locked(root / f".lock-{name}"):
        if not (stamp.exists() and stamp.read_text() == BASE_PINS[name]):
            _install_base(name, base, stamp, log)
    return site_packages(base)


def _install_base(name, base, stamp, log):
    _make_venv(base, log)
    pins = base / "pins.txt"
    pins.write_text(BASE_PINS[name])
    _sh([base / "bin" / "pip", "install", "-q", "-r", pins], log, env=_quiet_env())
    stamp.write_text(BASE_PINS[name])


def ensure_shims(root: pathlib.Path) -> pathlib.Path:
    shims = root / "cpu_shims"
    for pkg, text in CPU_SHIMS.items():
        f = shims / pkg / "__init__.py"
        if not f.exists() or f.read_text() != text:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
    return shims


def spec_of(version: str) -> str:
    """What the env of `version` is made of; a change rebuilds it."""
    return f"deepspeed=={version}\nbase={torch_base_of(version)}\npython={sys.version_info[:2]}\n"


def python_of(version: str, root: pathlib.Path = DEFAULT_ROOT, build: bool = True, log=None) -> pathlib.Path:
    """The interpreter that runs DeepSpeed `version`: the host's when it has that release installed,
    else root/ds-<version> (built first when `build`; EnvError when that fails or is not allowed)."""
    if version == host_deepspeed_version():
        return pathlib.Path(sys.executable)
    root = pathlib.Path(root)
    venv = root / f"ds-{version}"
    stamp = venv / ".gradtrace-spec"
    if stamp.exists() and stamp.read_text() == spec_of(version):
        return venv / "bin" / "python"
    if not build:
        raise EnvError(f"deepspeed {version}: no environment in {root} and building is off (--no-build)")
    root.mkdir(parents=True, exist_ok=True)
    with _locked(root / f".lock-ds-{version}"):  # two commands building one release: the second waits
        if stamp.exists() and stamp.read_text() == spec_of(version):
            return venv / "bin" / "python"
        return _build(version, root, venv, stamp, pathlib.Path(log or root / f"ds-{version}.log"))


def _build(version, root, venv, stamp, log):
    log.write_text("")
    base_sp = ensure_base(torch_base_of(version), root, log)
    _make_venv(venv, log)
    sp = site_packages(venv)
    # Appended to sys.path after the venv's own site-packages: deepspeed here wins, torch comes from the base.
    (sp / "_gradtrace_base_env.pth").write_text(f"{base_sp}\n")
    shims = sp / "_gradtrace_cpu_shims.pth"
    if version_key(version) < version_key("0.15.0"):  # the CPU accelerator needs the stubs before 0.15
        shims.write_text(f"{ensure_shims(root)}\n")
    elif shims.exists():
        shims.unlink()
    # DeepSpeed ships sdists only; building one without isolation needs `wheel` next to the venv's setuptools.
    _sh([venv / "bin" / "pip", "install", "-q", "--no-deps", WHEEL_PIN], log, env=_quiet_env())
    _sh([venv / "bin" / "pip", "install", "-q", "--no-deps", "--no-build-isolation", f"deepspeed=={version}"], log,
        env=_quiet_env(DS_BUILD_OPS="0"))
    check = subprocess.run([str(venv / "bin" / "python"), "-c", "import deepspeed; print(deepspeed.__version__)"],
                           capture_output=True, text=True, env=dict(os.environ, DS_ACCELERATOR="cpu"))
    got = check.stdout.strip().splitlines()[-1:] or [""]
    if check.returncode != 0 or got[0] != version:
        with open(log, "a") as f:
            f.write(check.stdout + check.stderr)
        raise EnvError(f"deepspeed {version}: `import deepspeed` failed in {venv} "
                       f"({(check.stderr.strip().splitlines() or ['?'])[-1][:200]}); see {log}")
    stamp.write_text(spec_of(version))
    return venv / "bin" / "python"
