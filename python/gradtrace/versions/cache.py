"""The result cache of gradtrace-versions: one folder per run, named by a hash of what decides its
gradients (package, release, config, entry point, layout, dependencies), so a second call reruns nothing.

    <cache>/runs/<key>/trace/        the captured trace set
    <cache>/runs/<key>/run.log       the run's output
    <cache>/runs/<key>/result.json   written last: its presence says the run finished (ok or failed)
    <cache>/diffs/<keyA>-<keyB>.json gradtrace-diff's report of A against B (and .md)
"""

import hashlib
import json
import os
import pathlib

from gradtrace.versions import packages


def default_root(package: str) -> pathlib.Path:
    """The package description's cache folder (~/.cache/gradtrace/versions, $GRADTRACE_VERSIONS_CACHE, unless
    it names its own: DeepSpeed's stays where gradtrace-deepspeed-versions always had it)."""
    return packages.describe(package).root("cache")


def key(**parts) -> str:
    """Stable hash of the parts (JSON with sorted keys)."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:20]


class Cache:

    def __init__(self, root):
        self.root = pathlib.Path(root)

    def run_dir(self, k: str) -> pathlib.Path:
        return self.root / "runs" / k

    def load(self, k: str):
        f = self.run_dir(k) / "result.json"
        return json.loads(f.read_text()) if f.exists() else None

    def store(self, k: str, result: dict):
        d = self.run_dir(k)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / "result.json.tmp"
        tmp.write_text(json.dumps(result, indent=1, sort_keys=True) + "\n")
        os.replace(tmp, d / "result.json")

    def diff_paths(self, ka: str, kb: str):
        d = self.root / "diffs"
        d.mkdir(parents=True, exist_ok=True)
        return d / f"{ka}-{kb}.json", d / f"{ka}-{kb}.md"
