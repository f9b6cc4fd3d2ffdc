#!/usr/bin/env python3
"""Puts the torch of one venv into another by hard links: the same installed files, no second copy.

    .venv/bin/python tools/link_torch.py DST_VENV     # run with the source venv's python

tools/wheel-check's fresh venv needs the pinned torch, which pip would unpack there again from the
wheelhouse: 5.5 GB more disk while the check runs (torch, triton and the CUDA libraries) and about
40 s of one core. This links instead every file of torch and of each distribution it requires
(markers and extras evaluated as pip does, e.g. cuda-toolkit[cublas,...]) from the running
interpreter's site-packages, RECORD and dist-info included, so the fresh venv's pip and
importlib.metadata see what a pip install leaves. Console scripts (torchrun, isympy, ...) are copied
with their shebang pointed at DST's python. A distribution DST already has in another version
(the venv's own setuptools) is uninstalled first, as pip's install would replace it.

Exits 3, having changed nothing, where links cannot work (another filesystem, a link refused, a
required distribution missing from the source): the caller installs from the wheelhouse instead.
"""

import importlib.metadata as md
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name


def closure(root):
    """{name: Distribution} for root and every distribution it requires, with extras."""
    found, todo = {}, [(canonicalize_name(root), frozenset())]
    while todo:
        name, extras = todo.pop()
        if name in found and extras <= found[name][1]:
            continue
        dist = md.distribution(name)  # PackageNotFoundError: the caller falls back
        extras = extras | (found[name][1] if name in found else frozenset())
        found[name] = (dist, extras)
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or any(req.marker.evaluate({"extra": e}) for e in {"", *extras}):
                todo.append((canonicalize_name(req.name), frozenset(req.extras)))
    return {n: d for n, (d, _) in found.items()}


def installed(site):
    """{canonical name: version} of the distributions in a site-packages folder."""
    return {canonicalize_name(d.metadata["Name"]): d.version for d in md.distributions(path=[str(site)])}


def main(argv):
    if len(argv) != 1:
        print("usage: link_torch.py DST_VENV", file=sys.stderr)
        return 2
    dst_venv = Path(argv[0]).resolve()
    src_site = Path(sysconfig.get_paths()["purelib"])
    rel_site = src_site.relative_to(sys.prefix)
    dst_site = dst_venv / rel_site
    dst_python = dst_venv / "bin" / "python"
    if not dst_site.is_dir() or not dst_python.exists():
        print(f"link_torch: {dst_venv}: not a venv of this python ({rel_site} missing)", file=sys.stderr)
        return 2
    try:
        dists = closure("torch")
    except md.PackageNotFoundError as e:
        print(f"link_torch: {sys.prefix} lacks {e.args[0]}, which torch requires", file=sys.stderr)
        return 3
    if os.stat(src_site).st_dev != os.stat(dst_site).st_dev:
        print(f"link_torch: {src_site} and {dst_site} are on different filesystems", file=sys.stderr)
        return 3
    # One link tried first (a filesystem without hard links, or a policy refusing them: EPERM, EMLINK), so a
    # refusal changes nothing in DST.
    probe_src = Path(dists["torch"].locate_file(next(f for f in dists["torch"].files if str(f).endswith(".py"))))
    probe = dst_site / ".link_torch_probe"
    try:
        if probe.exists():
            probe.unlink()
        os.link(probe_src, probe)
        probe.unlink()
    except OSError as e:
        print(f"link_torch: cannot hard-link {probe_src} into {dst_site}: {e.strerror}", file=sys.stderr)
        return 3

    have = installed(dst_site)
    replace = sorted(n for n, d in dists.items() if n in have and have[n] != d.version)
    if replace:
        subprocess.run([str(dst_python), "-m", "pip", "uninstall", "-q", "-y", *replace], check=True)
    files = links = 0
    old_shebang = f"#!{Path(sys.prefix) / 'bin' / 'python'}".encode()
    for name, dist in sorted(dists.items()):
        if have.get(name) == dist.version:
            continue
        for f in dist.files or []:
            src = Path(dist.locate_file(f))
            dst = Path(os.path.normpath(dst_site / f))
            if not src.is_file():
                continue  # RECORD may list a .pyc that was never written
            dst.parent.mkdir(parents=True, exist_ok=True)
            if dst.exists():
                dst.unlink()
            files += 1
            with open(src, "rb") as fh:
                first = fh.readline()
            # A script outside site-packages whose shebang names the source venv's python: copied,
            # pointed at DST's (as pip writes it there).
            if not dst.is_relative_to(dst_site) and first.startswith(old_shebang):
                data = src.read_bytes()
                dst.write_bytes(b"#!" + str(dst_python).encode() + data[len(old_shebang):])
                shutil.copymode(src, dst)
            else:
                os.link(src, dst)
                links += 1
    print(f"link_torch: torch {dists['torch'].version} and {len(dists) - 1} distributions it requires "
          f"into {dst_venv}: {links} of {files} files hard-linked from {sys.prefix}"
          + (f", replaced {', '.join(replace)}" if replace else ""), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
