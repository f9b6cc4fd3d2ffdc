"""Where the #5248 repro tools find the project's executables (gradtrace-diff, gradtrace-train)."""

import os
import pathlib
import shutil

ROOT = pathlib.Path(__file__).resolve().parents[3]


def find_binary(name):
    """`name` in $GRADTRACE_BUILD_DIR/bin or the usual build directories, else on PATH; None if nowhere."""
    for b in [os.environ.get("GRADTRACE_BUILD_DIR", "build"), "build", "build-lead", "build-old"]:
        p = ROOT / b / "bin" / name
        if p.exists():
            return p
    found = shutil.which(name)
    return pathlib.Path(found) if found else None
