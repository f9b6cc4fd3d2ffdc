"""pytest setup for the gradtrace Python package.

The package is assembled by CMake in $GRADTRACE_BUILD_DIR/python (default
build/); the C++ helpers the tests run against are in $GRADTRACE_BUILD_DIR/bin.
Build them with `cmake --build build --target gradtrace_python`.
"""

import os
import pathlib
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BUILD = pathlib.Path(os.environ.get("GRADTRACE_BUILD_DIR", "build"))
if not BUILD.is_absolute():
    BUILD = ROOT / BUILD
sys.path.insert(0, str(BUILD / "python"))

try:
    import gradtrace  # noqa: F401
except ImportError as e:  # one clear line instead of an error in every test module
    raise pytest.UsageError(f"cannot import gradtrace from {BUILD / 'python'} ({e}); "
                            f"build it: cmake --build {BUILD} --target gradtrace_python") from None


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
