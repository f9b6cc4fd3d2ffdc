"""pytest setup for the gradtrace Python package.

The package is assembled by CMake in $GRADTRACE_BUILD_DIR/python (default
build/); the C++ helpers the tests run against are in $GRADTRACE_BUILD_DIR/bin.
Build them with `cmake --build build --target gradtrace_python`.
"""

import os
import pathlib
import re
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
# The report's schema_version: the title of diff/REPORT_SCHEMA.md, which ctest diff_report_contract holds to the writer.
REPORT_SCHEMA_VERSION = re.match(r"# gradtrace-diff report \(schema_version (\d+\.\d+)\)",
                                 (ROOT / "diff" / "REPORT_SCHEMA.md").read_text())[1]
BUILD = pathlib.Path(os.environ.get("GRADTRACE_BUILD_DIR", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
sys.path.insert(0, str(BUILD / "python"))

try:
    import gradtrace  # noqa: F401
except ImportError as e:  # one clear line instead of an error in every test module
    raise pytest.UsageError(f"cannot import gradtrace from {BUILD / 'python'} ({e}); "
                            f"build it: cmake --build {BUILD} --target gradtrace_python") from None


def deepspeed_env() -> dict:
    """The environment for a launcher that starts DeepSpeed ranks on CPU (tools/repro/ds5248/run.py, alst.py):
    this build's gradtrace package first on PYTHONPATH, and no RANK inherited from an outer launcher."""
    path = [str(BUILD / "python")] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(path), DS_ACCELERATOR="cpu")
    env.pop("RANK", None)
    return env


# A small gradtrace-train model: one layer, one step, buckets of 2000 elements (several per step).
SMALL_TRAIN = ["--seq-len", "16", "--hidden", "32", "--vocab", "64", "--heads", "4", "--layers", "1", "--steps", "1",
               "--batch", "2", "--reduce-bucket-size", "2000"]


def train_small(out, *args, timeout=180):
    """gradtrace-train on the SMALL_TRAIN model into `out`, with `args` added; returns `out`."""
    import subprocess

    train = _binary("gradtrace-train")
    p = subprocess.run([str(train), *SMALL_TRAIN, "--out", str(out), *map(str, args)], capture_output=True, text=True,
                       timeout=timeout)
    assert p.returncode == 0, p.stdout + p.stderr
    return out


def script_runs(tmp_path_factory, label: str, command, timeout: int):
    """run(name) -> the output directory of run ``name``, made once (module fixtures build on it):
    ``command(name, out)`` gives the arguments after this interpreter; the run must exit 0 (else its
    command and output tails fail the test). ``run.root`` is the folder holding the runs,
    ``run.stderr(name)`` a finished run's stderr."""
    import subprocess

    root = tmp_path_factory.mktemp(label)
    done = {}

    def get(name):
        if name not in done:
            out = root / name
            cmd = [sys.executable, *map(str, command(name, out))]
            p = subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=timeout)
            assert p.returncode == 0, \
                f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-4000:]}"
            done[name] = (out, p.stderr)
        return done[name][0]

    get.root = root
    get.stderr = lambda name: done[name][1]
    return get


def _binary(name: str) -> pathlib.Path:
    path = BUILD / "bin" / name
    if not path.exists():
        pytest.fail(f"{path} not built: cmake --build {BUILD} --target gradtrace_python")
    return path


@pytest.fixture(scope="session")
def cpp_writer() -> pathlib.Path:
    """gradtrace-pytest-writer: `write PATH` (the known trace), `dump PATH`."""
    return _binary("gradtrace-pytest-writer")


@pytest.fixture(scope="session")
def inspect_bin() -> pathlib.Path:
    return _binary("gradtrace-inspect")
