"""One Python environment per release of a distribution, over a shared base (gradtrace-versions).

DeepSpeed's environments are gradtrace.deepspeed_versions.envs (a pinned torch base for old releases,
import stubs, DS_BUILD_OPS=0); every other distribution's are built here, under the env root (default
~/.cache/gradtrace/version-envs, --env-root or $GRADTRACE_VERSION_ENVS):

    <name>-<version>/   a venv without pip of its own, whose site-packages holds the release (and what it
                        needs that the base lacks), with a .pth that appends the base's site-packages: the
                        interpreter running the command (the project's .venv: torch, numpy, ...).
    .gradtrace-spec     written last: what the env is made of; a different spec rebuilds it.

Dependencies (--deps): "resolve" (default) lets pip resolve the release's requirements against the
base, so only what is missing or refused is installed into the release's env (the base is never written;
pip leaves a distribution outside the env alone and the env's copy shadows it). torch is held at the base's
version by a constraint: a release that needs another torch fails to install and is skipped, rather than
pulling gigabytes. "none": the release alone (--no-deps), as DeepSpeed's environments are.
A release equal to the one the host has installed runs in the host interpreter itself.
"""

import os
import pathlib
import subprocess
import sys
import sysconfig
from importlib.metadata import PackageNotFoundError, version as installed_version

from gradtrace.deepspeed_versions import envs as ds_envs
from gradtrace.versions import venvs
from gradtrace.versions.releases import normalize_name

EnvError = venvs.EnvError
DEFAULT_ROOT = pathlib.Path(os.environ.get("GRADTRACE_VERSION_ENVS", "~/.cache/gradtrace/version-envs")).expanduser()
DEEPSPEED_ROOT = ds_envs.DEFAULT_ROOT
HELD = ("torch",)  # the base's copy is the one every release runs on


def default_root(package: str) -> pathlib.Path:
    return DEEPSPEED_ROOT if normalize_name(package) == "deepspeed" else DEFAULT_ROOT


def host_version(package: str):
    """The release of `package` installed in this interpreter, or None (metadata only, no import)."""
    try:
        return installed_version(package)
    except PackageNotFoundError:
        return None


def spec_of(package: str, version: str, deps: str) -> str:
    held = "".join(f"{h}=={host_version(h)}\n" for h in HELD if host_version(h))
    return (f"{normalize_name(package)}=={version}\ndeps={deps}\nbase={sysconfig.get_paths()['purelib']}\n"
            f"{held}python={sys.version_info[:2]}\n")


def python_of(package: str, version: str, root: pathlib.Path, build: bool = True, log=None,
              deps: str = "resolve") -> pathlib.Path:
    """The interpreter that runs `package` at `version`: the host's when it has that release, else
    root/<name>-<version> (built first when `build`; EnvError when that fails or is not allowed)."""
    if normalize_name(package) == "deepspeed":
        return ds_envs.python_of(version, root, build=build, log=log)
    if version == host_version(package):
        return pathlib.Path(sys.executable)
    root = pathlib.Path(root)
    venv = root / f"{normalize_name(package)}-{version}"
    stamp = venv / ".gradtrace-spec"
    spec = spec_of(package, version, deps)
    if stamp.exists() and stamp.read_text() == spec:
        return venv / "bin" / "python"
    if not build:
        raise EnvError(f"{package} {version}: no environment in {root} and building is off (--no-build)")
    root.mkdir(parents=True, exist_ok=True)
    with venvs.locked(root / f".lock-{venv.name}"):  # two commands building one release: the second waits
        if not (stamp.exists() and stamp.read_text() == spec):
            _build(package, version, venv, deps, pathlib.Path(log or root / f"{venv.name}.log"))
            stamp.write_text(spec)
    return venv / "bin" / "python"


def _build(package, version, venv, deps, log):
    log.write_text("")
    if not (venv / "bin" / "python").exists():
        # No pip of its own (ensurepip costs seconds): the base's pip, reached through the .pth, installs.
        venvs.sh([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", venv], log)
    sp = venvs.site_packages(venv)
    # Appended to sys.path after the venv's own site-packages: the release here wins, the rest is the base's.
    (sp / "_gradtrace_base_env.pth").write_text(f"{sysconfig.get_paths()['purelib']}\n")
    cmd = [venv / "bin" / "python", "-m", "pip", "install", "-q", f"{package}=={version}"]
    if deps == "none":
        cmd.insert(-1, "--no-deps")
    else:
        held = venv / "held.txt"
        held.write_text("".join(f"{h}=={host_version(h)}\n" for h in HELD if host_version(h)))
        cmd[-1:-1] = ["-c", held]
    venvs.sh(cmd, log, env=venvs.quiet_env(PIP_NO_INPUT="1"))
    check = subprocess.run([str(venv / "bin" / "python"), "-c",
                            f"from importlib.metadata import version; print(version({package!r}))"],
                           capture_output=True, text=True)
    got = check.stdout.strip().splitlines()[-1:] or [""]
    if check.returncode != 0 or got[0] != version:
        with open(log, "a") as f:
            f.write(check.stdout + check.stderr)
        raise EnvError(f"{package} {version}: the environment {venv} reports {got[0] or 'nothing'}; see {log}")
