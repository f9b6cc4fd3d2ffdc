#!/usr/bin/env python3
"""Checks what the gradtrace wheel holds: exactly the package's .py files and data (python/gradtrace/: the
versions command's package descriptions, *.json), no study (no ds5248* file: issue 43), the codec extension
_gtcodec, the gradtrace-diff, gradtrace-inspect and gradtrace-pack scripts (executable), the
dist-info; after `auditwheel repair` also the shared libraries it grafted (gradtrace.libs/) and the
executables its scripts start (gradtrace.scripts/); no capture/ (LibTorch) code; numpy as its only
dependency.

    wheel_contents.py WHEEL

Exit 0 and one summary line, or 1 and a line per problem, each naming the wheel.
"""

import pathlib
import re
import sys
import zipfile

ROOT = pathlib.Path(__file__).resolve().parents[2]
SCRIPTS = {"gradtrace-diff", "gradtrace-inspect", "gradtrace-pack"}


def problems(wheel):
    with zipfile.ZipFile(wheel) as z:
        infos = {i.filename: i for i in z.infolist() if not i.is_dir()}
        metadata = next((z.read(n).decode() for n in infos if n.endswith(".dist-info/METADATA")), "")
    package = ROOT / "python" / "gradtrace"
    py = {f"gradtrace/{p.relative_to(package).as_posix()}" for suffix in ("*.py", "*.json") for p in package.rglob(suffix)}
    ext = {n for n in infos if re.fullmatch(r"gradtrace/_gtcodec\.cpython-[^/]+\.so", n)}
    scripts = {n for n in infos if re.fullmatch(r"gradtrace-[^/]+\.data/scripts/[^/]+", n)}
    dist_info = {n for n in infos if re.fullmatch(r"gradtrace-[^/]+\.dist-info/.+", n)}
    libs = {n for n in infos if re.fullmatch(r"gradtrace\.libs/lib[^/]+\.so(\.[0-9]+)*", n)}
    exes = {n for n in infos if re.fullmatch(r"gradtrace\.scripts/[^/]+", n)}
    out = []
    if missing := py - set(infos):
        out.append(f"missing Python files {sorted(missing)}")
    if len(ext) != 1:
        out.append(f"expected one _gtcodec extension, found {sorted(ext)}")
    if {n.rsplit("/", 1)[1] for n in scripts} != SCRIPTS:
        out.append(f"expected scripts {sorted(SCRIPTS)}, found {sorted(scripts)}")
    if exes and {n.rsplit("/", 1)[1] for n in exes} != SCRIPTS:
        out.append(f"expected executables {sorted(SCRIPTS)} in gradtrace.scripts/, found {sorted(exes)}")
    for n in scripts | exes:
        if not (infos[n].external_attr >> 16) & 0o111:
            out.append(f"{n} is not executable")
    if extra := set(infos) - py - ext - scripts - dist_info - libs - exes:
        out.append(f"unexpected files {sorted(extra)}")
    if any(re.search(r"(^|/)capture/|gradtrace-train", n) for n in infos):  # not adapters/capture_protocol.py
        out.append("holds capture/ code")
    if studies := sorted(n for n in infos if n.rsplit("/", 1)[-1].startswith("ds5248")):
        out.append(f"holds study code {studies} (tools/repro/ds5248 is not the library)")
    requires = re.findall(r"^Requires-Dist: (\S+)", metadata, re.M)
    if requires != ["numpy"]:
        out.append(f"dependencies {requires}, expected ['numpy']")
    return out, len(infos)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 1:
        print(__doc__, file=sys.stderr)
        return 2
    found, count = problems(argv[0])
    for p in found:
        print(f"{argv[0]}: {p}", file=sys.stderr)
    if not found:
        print(f"wheel_contents: {argv[0]}: {count} files as expected", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
