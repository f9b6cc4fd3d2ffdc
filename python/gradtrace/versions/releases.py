"""A distribution's published releases (PyPI's JSON API, cached) and their order (gradtrace-versions).

A release counts as published when it has files, is not yanked and is not a pre-release (a/b/rc/dev);
post releases ("1.4.0.post0") are releases. `--bisect` and `--from/--to` only visit those.
"""

import json
import os
import pathlib
import re
import time
import urllib.request

PYPI_URL = "https://pypi.org/pypi/{name}/json"
PYPI_MAX_AGE_S = 24 * 3600  # re-read PyPI's list once a day; --refresh-releases forces it

# PEP 440's public version, normalised (lower case, no leading v): release, pre, post, dev; a local part is
# ignored. Enough to order what PyPI publishes without the `packaging` distribution (not a dependency).
_VERSION = re.compile(r"^v?(\d+(?:\.\d+)*)(?:[-_.]?(a|b|c|rc|alpha|beta|pre|preview)[-_.]?(\d*))?"
                      r"(?:[-_.]?(post|rev|r)[-_.]?(\d*)|-(\d+))?(?:[-_.]?dev[-_.]?(\d*))?(?:\+[a-z0-9.]+)?$")
_PRE = {"a": 0, "alpha": 0, "b": 1, "beta": 1, "c": 2, "rc": 2, "pre": 2, "preview": 2}


def normalize_name(name: str) -> str:
    """PEP 503: "Pytorch_MSSSIM" and "pytorch-msssim" are one distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


def valid_name(name: str) -> bool:
    """A distribution name as PEP 508 allows it (letters, digits, - _ .; alphanumeric at both ends)."""
    return bool(re.fullmatch(r"[A-Za-z0-9]([A-Za-z0-9._-]*[A-Za-z0-9])?", name))


def version_key(version: str):
    """Sort key of a release string, PEP 440 order: 0.14.3 < 0.14.10, 1.0rc1 < 1.0 < 1.0.post0,
    1.0.dev0 < 1.0a1. ValueError when it is not a version."""
    m = _VERSION.match(version.strip().lower())
    if not m:
        raise ValueError(f"not a release number: {version!r}")
    nums = tuple(int(x) for x in m.group(1).split("."))
    nums = nums + (0,) * max(0, 6 - len(nums))
    pre = (_PRE[m.group(2)], int(m.group(3) or 0)) if m.group(2) else None
    post_n = m.group(5) if m.group(4) else m.group(6)
    post = int(post_n or 0) if (m.group(4) or m.group(6)) else -1
    dev = None if m.group(7) is None else int(m.group(7) or 0)
    # a dev release of a final sorts before its pre-releases; a pre-release before the final.
    pre_key = (-1, 0) if pre is None and post < 0 and dev is not None else (pre if pre else (9, 0))
    return nums, pre_key, post, (dev is None, dev or 0)


def is_prerelease(version: str) -> bool:
    """a/b/rc/dev releases ("0.9.0rc1", "0.16.0.dev0"); post releases are releases."""
    _, pre_key, _, (final, _) = version_key(version)
    return pre_key != (9, 0) or not final


def load_pypi(name: str, cache_dir: pathlib.Path, refresh: bool = False) -> dict:
    """PyPI's JSON document for distribution `name`, from `cache_dir/pypi-NAME.json` when fresh enough."""
    norm = normalize_name(name)
    cache = pathlib.Path(cache_dir) / f"pypi-{norm}.json"
    if cache.exists() and not refresh and time.time() - cache.stat().st_mtime < PYPI_MAX_AGE_S:
        return json.loads(cache.read_text())
    url = PYPI_URL.format(name=norm)
    try:
        with urllib.request.urlopen(url, timeout=60) as r:
            doc = json.loads(r.read().decode())
    except OSError as e:
        if cache.exists():  # offline: an old list is better than none
            return json.loads(cache.read_text())
        raise RuntimeError(f"{url}: cannot read {name}'s release list ({e})") from None
    cache.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache.with_suffix(".tmp")
    tmp.write_text(json.dumps(doc))
    os.replace(tmp, cache)
    return doc


def published(doc: dict) -> list:
    """The releases worth running, oldest first: with files, not yanked, not pre-releases."""
    out = []
    for version, files in doc.get("releases", {}).items():
        if not files or all(f.get("yanked") for f in files):
            continue
        try:
            if is_prerelease(version):
                continue
        except ValueError:
            continue
        out.append(version)
    return sorted(out, key=version_key)


def between(releases: list, lo: str, hi: str) -> list:
    """The releases r with lo <= r <= hi (both ends included), oldest first."""
    a, b = version_key(lo), version_key(hi)
    return [r for r in releases if a <= version_key(r) <= b]
