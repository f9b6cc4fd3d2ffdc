"""The package version for scikit-build-core ([[tool.dynamic-metadata]] in ../pyproject.toml).

Its one home is `project(gradtrace VERSION ...)` in the top-level CMakeLists.txt: one folder up in a
checkout, cpp/ in the sdist (the regex provider reads one fixed path, which cannot be both).
"""

import pathlib
import re


def dynamic_metadata(settings, _project):
    if settings.get("field") != "version":
        raise ValueError(f"gradtrace_version provides the version, not {settings.get('field')!r}")
    # cpp/ first: it exists only in an unpacked sdist, whose parent folder is anyone's.
    for path in (pathlib.Path("cpp/CMakeLists.txt"), pathlib.Path("../CMakeLists.txt")):
        if path.is_file():
            match = re.search(r"project\(gradtrace VERSION ([0-9.]+)", path.read_text(encoding="utf-8"))
            if not match:
                raise RuntimeError(f"{path}: no 'project(gradtrace VERSION ...)'")
            return {"version": match.group(1)}
    raise FileNotFoundError("no cpp/CMakeLists.txt (sdist) or ../CMakeLists.txt (checkout)")
