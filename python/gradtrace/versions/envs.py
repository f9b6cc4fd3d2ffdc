"""One Python environment per release of a distribution, over a shared base (gradtrace-versions).

How a package's environments are built is its description's "environments" section (gradtrace.versions.packages;
DeepSpeed's: a pinned torch base before 0.15, import stubs, DS_BUILD_OPS=0). Under the env root (default
~/.cache/gradtrace/version-envs, --env-root or $GRADTRACE_VERSION_ENVS; a description may name its own):

    <name>-<version>/   a venv (folder name: the description's "venv") whose site-packages holds the release (and
                        what it needs that the base lacks), with a .pth that appends the base's site-packages.
                        The base is the interpreter running the command (the project's .venv: torch, numpy, ...),
                        or for the releases before a description's "bases" entry that pinned base:
    <base>/             a venv of exactly the base's pins (installed once; a change of pins reinstalls it), beside
    <base>-stubs/       the base's import stubs (modules a release imports but a CPU run never uses), on the path
                        of every release over that base
    .gradtrace-spec     written last in each venv: what the env is made of; a different spec rebuilds it.

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

from gradtrace.versions import packages, venvs
from gradtrace.versions.releases import version_key

EnvError = venvs.EnvError
HELD = ("torch",)  # the base's copy is the one every release runs on (deps resolve)


def default_root(package: str) -> pathlib.Path:
    return packages.describe(package).root("environments")


def host_version(package: str):
    """The release of `package` installed in this interpreter, or None (metadata only, no import)."""
    try:
        return installed_version(package)
    except PackageNotFoundError:
        return None


def base_of(desc, version: str):
    """The pinned base (its "bases" entry) that `version` runs on, or None: over the host interpreter."""
    for b in desc["environments"]["bases"]:
        if version_key(version) < version_key(b["before"]):
            return b
    return None


def spec_of(package: str, version: str, deps: str) -> str:
    base = base_of(packages.describe(package), version)
    held = "".join(f"{h}=={host_version(h)}\n" for h in HELD if host_version(h)) if deps == "resolve" else ""
    return (f"{packages.normalize_name(package)}=={version}\ndeps={deps}\n"
            f"base={base['name'] if base else sysconfig.get_paths()['purelib']}\n{held}python={sys.version_info[:2]}\n")


def python_of(package: str, version: str, root=None, build: bool = True, log=None, deps=None) -> pathlib.Path:
    """The interpreter that runs `package` at `version`: the host's when it has that release, else
    root/<venv> (built first when `build`; EnvError when that fails or is not allowed). `root` and `deps`
    default to the package description's."""
    desc = packages.describe(package)
    deps = deps or desc["defaults"]["deps"]
    if version == host_version(package):
        return pathlib.Path(sys.executable)
    root = pathlib.Path(root or desc.root("environments"))
    venv = root / desc["environments"]["venv"].format(name=desc.name, release=version)
    stamp = venv / ".gradtrace-spec"
    spec = spec_of(package, version, deps)
    if stamp.exists() and stamp.read_text() == spec:
        return venv / "bin" / "python"
    if not build:
        raise EnvError(f"{package} {version}: no environment in {root} and building is off (--no-build)")
    root.mkdir(parents=True, exist_ok=True)
    with venvs.locked(root / f".lock-{venv.name}"):  # two commands building one release: the second waits
        if not (stamp.exists() and stamp.read_text() == spec):
            _build(desc, package, version, root, venv, deps, pathlib.Path(log or root / f"{venv.name}.log"))
            stamp.write_text(spec)
    return venv / "bin" / "python"


def ensure_base(base: dict, root: pathlib.Path, log) -> pathlib.Path:
    """The site-packages folder of a pinned base (installed when missing or when its pins changed)."""
    venv = root / base["name"]
    pins = "".join(f"{p}\n" for p in base["pins"])
    stamp = venv / ".gradtrace-pins"
    if not (stamp.exists() and stamp.read_text() == pins):
        with venvs.locked(root / f".lock-{base['name']}"):
            if not (stamp.exists() and stamp.read_text() == pins):
                venvs.make_venv(venv, log)
                (venv / "pins.txt").write_text(pins)
                venvs.sh([venv / "bin" / "pip", "install", "-q", "-r", venv / "pins.txt"], log, env=venvs.quiet_env())
                stamp.write_text(pins)
    return venvs.site_packages(venv)


def ensure_stubs(base: dict, root: pathlib.Path) -> pathlib.Path:
    """The folder of a base's import stubs, one package per stub, rewritten when its text changed."""
    folder = root / f"{base['name']}-stubs"
    for module, lines in base.get("stubs", {}).items():
        f = folder / module / "__init__.py"
        text = "".join(f"{line}\n" for line in lines)
        if not f.exists() or f.read_text() != text:
            f.parent.mkdir(parents=True, exist_ok=True)
            f.write_text(text)
    return folder


def _build(desc, package, version, root, venv, deps, log):
    e = desc["environments"]
    log.write_text("")
    base = base_of(desc, version)
    base_sp = ensure_base(base, root, log) if base else pathlib.Path(sysconfig.get_paths()["purelib"])
    if e["pip_in_venv"]:
        venvs.make_venv(venv, log)
        pip = [venv / "bin" / "pip"]
    else:
        if not (venv / "bin" / "python").exists():
            # No pip of its own (ensurepip costs seconds): the base's pip, reached through the .pth, installs.
            venvs.sh([getattr(sys, "_base_executable", sys.executable), "-m", "venv", "--without-pip", venv], log)
        pip = [venv / "bin" / "python", "-m", "pip"]
    sp = venvs.site_packages(venv)
    # Appended to sys.path after the venv's own site-packages: the release here wins, the rest is the base's.
    (sp / "_gradtrace_base_env.pth").write_text(f"{base_sp}\n")
    stubs = sp / "_gradtrace_stubs.pth"
    if base and base.get("stubs"):
        stubs.write_text(f"{ensure_stubs(base, root)}\n")
    elif stubs.exists():
        stubs.unlink()
    quiet = venvs.quiet_env(PIP_NO_INPUT="1", **e["install_env"])
    if e["install_first"]:
        venvs.sh([*pip, "install", "-q", "--no-deps", *e["install_first"]], log, env=quiet)
    cmd = [*pip, "install", "-q", *e["install_options"], f"{package}=={version}"]
    if deps == "none":
        cmd.insert(-1, "--no-deps")
    else:
        held = venv / "held.txt"
        held.write_text("".join(f"{h}=={host_version(h)}\n" for h in HELD if host_version(h)))
        cmd[-1:-1] = ["-c", held]
    venvs.sh(cmd, log, env=quiet)
    check = "from importlib.metadata import version; "
    if e["import_check"]:
        check += f"import {e['import_check']}; "
    check += f"print(version({package!r}))"
    p = subprocess.run([str(venv / "bin" / "python"), "-c", check], capture_output=True, text=True,
                       env=dict(os.environ, **e["check_env"]))
    got = p.stdout.strip().splitlines()[-1:] or [""]
    if p.returncode != 0 or got[0] != version:
        with open(log, "a") as f:
            f.write(p.stdout + p.stderr)
        said = (p.stderr.strip().splitlines() or ["?"])[-1][:200] if p.returncode else got[0] or "nothing"
        raise EnvError(f"{package} {version}: the environment {venv} reports {said}; see {log}")
