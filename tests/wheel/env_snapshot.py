#!/usr/bin/env python3
"""What an environment's torch is, to prove that installing the gradtrace wheel leaves it alone.

    env_snapshot.py OUT.json                  # record
    env_snapshot.py OUT.json --against BEFORE.json --allow gradtrace numpy

Records torch's version and install location, every installed distribution with its version, and
for every file torch's RECORD lists its inode, size and mtime (a reinstall writes new files, so a
replaced torch changes them without hashing gigabytes). With --against, exits 1 with one line per
difference: torch's version, location or files changed, or a distribution other than --allow
added, removed or changed version.
"""

import argparse
import importlib.metadata as md
import json
import os
import sys


def snapshot():
    import torch  # noqa: F401 -- the import itself must still work
    dist = md.distribution("torch")
    files = {}
    for f in dist.files or []:
        path = str(f.locate())
        st = os.stat(path)
        files[str(f)] = [st.st_ino, st.st_size, st.st_mtime_ns]
    return {"torch_version": torch.__version__, "torch_location": os.path.dirname(torch.__file__),
            "distributions": {d.metadata["Name"].lower(): d.version for d in md.distributions()},
            "torch_files": files}


def differences(before, after, allow):
    out = []
    for key in ("torch_version", "torch_location"):
        if before[key] != after[key]:
            out.append(f"{key}: {before[key]} -> {after[key]}")
    changed = [f for f in before["torch_files"] if before["torch_files"][f] != after["torch_files"].get(f)]
    if changed or len(before["torch_files"]) != len(after["torch_files"]):
        out.append(f"torch files: {len(changed)} of {len(before['torch_files'])} changed "
                   f"(now {len(after['torch_files'])}), e.g. {changed[:3]}")
    b, a = before["distributions"], after["distributions"]
    for name in sorted(set(b) | set(a)):
        if name not in allow and b.get(name) != a.get(name):
            out.append(f"distribution {name}: {b.get(name, 'absent')} -> {a.get(name, 'absent')}")
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--against", help="a snapshot taken before; exit 1 if torch or other packages changed")
    ap.add_argument("--allow", nargs="*", default=[], help="distributions the install may add or change")
    args = ap.parse_args(argv)
    snap = snapshot()
    with open(args.out, "w") as f:
        json.dump(snap, f)
    print(f"env_snapshot: torch {snap['torch_version']} at {snap['torch_location']} "
          f"({len(snap['torch_files'])} files), {len(snap['distributions'])} distributions", file=sys.stderr)
    if args.against:
        with open(args.against) as f:
            before = json.load(f)
        diffs = differences(before, snap, {n.lower() for n in args.allow})
        for d in diffs:
            print(f"env_snapshot: {args.against} -> {args.out}: {d}", file=sys.stderr)
        return 1 if diffs else 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
