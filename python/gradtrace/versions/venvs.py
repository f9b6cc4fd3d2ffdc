"""The shell work behind every release environment of gradtrace-versions: make a venv, run a command into
a log, hold a lock while one is built (gradtrace.versions.envs)."""

import contextlib
import fcntl
import os
import pathlib
import subprocess
import sys


class EnvError(RuntimeError):
    """A release's environment could not be built; the message names the log."""


def site_packages(venv: pathlib.Path) -> pathlib.Path:
    return venv / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def sh(cmd, log, env=None):
    with open(log, "a") as f:
        f.write("+ " + " ".join(map(str, cmd)) + "\n")
        f.flush()
        rc = subprocess.call([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, env=env)
    if rc != 0:
        raise EnvError(f"{' '.join(map(str, cmd[:4]))} ... failed (exit {rc}); see {log}")


def make_venv(path: pathlib.Path, log):
    if not (path / "bin" / "python").exists():
        # The base interpreter, not this venv's: a venv made from inside a venv would nest nothing anyway.
        sh([getattr(sys, "_base_executable", sys.executable), "-m", "venv", path], log)


def quiet_env(**extra):
    return dict(os.environ, PIP_DISABLE_PIP_VERSION_CHECK="1", **extra)


@contextlib.contextmanager
def locked(path):
    with open(path, "w") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)
