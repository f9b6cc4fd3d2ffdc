#!/usr/bin/env python3
"""Checks that the gradtrace wheel is self-contained: `auditwheel show --json` finds a manylinux tag
(the one in the wheel's name) and no library outside the wheel but the policy's allow-list; then
`ldd` on every ELF file the wheel installed into VENV (its RECORD) resolves each library inside VENV
or to a system library on that allow-list (libc, libstdc++, libz, ...), and none is missing.

    wheel_libs.py WHEEL VENV

Run by tools/wheel-check with .venv's python, which has auditwheel (tools/requirements.txt).
Exit 0 and one summary line, or 1 and a line per problem, each naming the file.
"""

import json
import pathlib
import re
import subprocess
import sys
from importlib import resources


def allow_list(tag):
    """The sonames manylinux policy `tag` (manylinux_2_34_x86_64) lets a wheel take from the system."""
    policies = json.loads((resources.files("auditwheel.policy") / "manylinux-policy.json").read_text())
    name = re.sub(r"_x86_64$", "", tag)
    return next(set(p["lib_whitelist"]) for p in policies if p["name"] == name)


def show_problems(wheel):
    """The wheel's platform tag and what `auditwheel show --json` objects to."""
    run = subprocess.run([sys.executable, "-m", "auditwheel", "show", "--json", str(wheel)],
                         capture_output=True, text=True)
    try:
        show = json.loads(run.stdout)
    except ValueError:
        return None, [f"auditwheel show exited {run.returncode}: {run.stderr.strip() or run.stdout.strip()}"]
    if "error" in show:
        return None, [f"auditwheel show: {show['error']}"]
    tag = show["overall_tag"]
    out = []
    if not tag.startswith("manylinux_"):
        out.append(f"auditwheel show: platform tag {tag}, expected manylinux_*")
    if not wheel.name.endswith(f"-{tag}.whl"):
        out.append(f"auditwheel show: tag {tag} is not the one in the file name")
    if show["external_libs"]:
        out.append(f"auditwheel show: libraries from outside the wheel {sorted(show['external_libs'])}")
    return tag, out


def installed_elf_files(venv):
    """Every ELF file gradtrace's RECORD lists in venv (the extension, the executables, gradtrace.libs)."""
    site = next(venv.glob("lib/python*/site-packages"))
    record = next(site.glob("gradtrace-*.dist-info/RECORD"))
    for line in record.read_text().splitlines():
        path = (site / line.split(",")[0]).resolve()
        if path.is_file() and path.read_bytes()[:4] == b"\x7fELF":
            yield path


def ldd_problems(path, venv, allowed):
    """Libraries `ldd path` finds missing, or resolves from the system though not on the allow-list."""
    run = subprocess.run(["ldd", str(path)], capture_output=True, text=True)
    if run.returncode != 0:
        return [f"{path}: ldd exited {run.returncode}: {run.stderr.strip()}"]
    out = []
    for soname, target in re.findall(r"^\s*(\S+) => (.+?)(?: \(0x[0-9a-f]+\))?$", run.stdout, re.M):
        if target == "not found":
            out.append(f"{path}: {soname} not found")
        elif not pathlib.Path(target).resolve().is_relative_to(venv.resolve()) and soname not in allowed:
            out.append(f"{path}: {soname} resolves from the system ({target}), not on the manylinux allow-list")
    return out


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    if len(argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    wheel, venv = pathlib.Path(argv[0]), pathlib.Path(argv[1])
    tag, found = show_problems(wheel)
    files = list(installed_elf_files(venv))
    if tag and tag.startswith("manylinux_"):
        allowed = allow_list(tag)
        for path in files:
            found += ldd_problems(path, venv, allowed)
    if len(files) < 4:  # _gtcodec and the three executables at least
        found.append(f"{venv}: only {len(files)} ELF files installed from the wheel")
    for p in found:
        print(f"{wheel.name}: {p}", file=sys.stderr)
    if not found:
        libs = sorted(p.name for p in files if p.parent.name == "gradtrace.libs")
        print(f"wheel_libs: {wheel.name}: {tag}; {len(files)} ELF files resolve only in the venv or the "
              f"allow-list; grafted {libs}", file=sys.stderr)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
