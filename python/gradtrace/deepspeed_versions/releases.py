"""DeepSpeed's published releases (PyPI's JSON API, cached) and the torch base each release runs on.

Part of gradtrace-deepspeed-versions (gradtrace/deepspeed_versions.py). A release counts as published
when it has files, is not yanked and is not a pre-release; `--bisect` and `--from/--to` only visit those.
"""

import json
import os
import pathlib
import re
import time
import urllib.request

PYPI_URL = "https://pypi.org/pypi/deepspeed/json"
PYPI_MAX_AGE_S = 24 * 3600  # re-read PyPI's list once a day; --refresh-releases forces it


def version_key(version: str):
    """Sort key of a release string ("0.14.3" < "0.14.10"); pre-release tags sort before the release."""
    m = re.match(r"^(\d+(?:\.\d+)*)(.*)$", version)
    if not m:
        raise ValueError(f"not a DeepSpeed version: {version!r}")
    nums = tuple(int(x) for x in m.group(1).split("."))
    nums += (0,) * (4 - len(nums))
    return nums + ((0, m.group(2)) if m.group(2) else (1, ""))


def is_prerelease(version: str) -> bool:
    """a/b/rc/dev releases ("0.9.0rc1", "0.16.0.dev0"); post releases are releases."""
    return bool(re.search(r"[a-z]", version.lower().split("+")[0].replace("post", "")))


def load_pypi(cache_dir: pathlib.Path, refresh: bool = False) -> dict:
    """PyPI's JSON document for deepspeed, from `cache_dir/pypi-deepspeed.json` when fresh enough."""
    cache = pathlib.Path(cache_dir) / "pypi-deepspeed.json"
    if cache.exists() and not refresh and time.time() - cache.stat().st_mtime < PYPI_MAX_AGE_S:
        return json.loads(cache.read_text())
    try:
        with urllib.request.urlopen(PYPI_URL, timeout=60) as r:
            doc = json.loads(r.read().decode())
    except OSError as e:
        if cache.exists():  # offline: an old list is better than none
            return json.loads(cache.read_text())
        raise RuntimeError(f"{PYPI_URL}: cannot read DeepSpeed's release list ({e})") from None
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, cache)
    return doc


def published(doc: dict) -> list:
    """The releases worth running, oldest first: with files, not yanked, not pre-releases."""
    out = []
    for version, files in doc.get("releases", {}).items():
        if not files or all(f.get("yanked") for f in files) or is_prerelease(version):
            continue
        try:
            version_key(version)
        except ValueError:
            continue
        out.append(version)
    return sorted(out, key=version_key)


def between(releases: list, lo: str, hi: str) -> list:
    """The releases r with lo <= r <= hi (both ends included), oldest first."""
    a, b = version_key(lo), version_key(hi)
    return [r for r in releases if a <= version_key(r) <= b]


# The torch base a release runs on. "torch-2.1.2": the pinned base of dsversions_envs (pydantic 1.10,
# numpy 1.26), what 0.11.x-0.14.x shipped against; "host": the interpreter running the command (the
# project's .venv: torch 2.15.0, pydantic 2). Evidence for the boundary, measured by building both sides
# of it: docs/deepspeed-versions/README.md ("Which torch each release runs on"); 0.15.0 needs pydantic 2.
HOST_FROM = "0.15.0"


def torch_base_of(version: str) -> str:
    return "torch-2.1.2" if version_key(version) < version_key(HOST_FROM) else "host"
