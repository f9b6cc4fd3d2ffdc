"""Runs a command with one directory on a small filesystem of its own, so that writes there fail with a
real write error once it is full (issue 20: capture never takes training down).

    proc, method = run_on_small_fs(argv, mount_dir, size, keep_dir, timeout=...)

"tmpfs": the command runs in a private mount namespace (``unshare -m`` as root, ``unshare -rm``
otherwise) with a tmpfs of ``size`` bytes mounted on ``mount_dir``; what it left there is copied to
``keep_dir`` before the namespace ends, so no mount outlives it (``mount_dir`` stays empty).
"rlimit": where neither can mount, RLIMIT_FSIZE of ``size / 2`` bytes (one file of each of two ranks)
in the child (CPython ignores SIGXFSZ, so a write past it fails with EFBIG), then the same copy.
$GRADTRACE_SMALL_FS=rlimit forces the fallback.
"""

import functools
import os
import resource
import shutil
import subprocess
import tempfile

_IN_NAMESPACE = """mnt=$1 keep=$2 size=$3; shift 3
mount -t tmpfs -o size="$size" tmpfs "$mnt" || exit 97
"$@"; rc=$?
cp -a "$mnt"/. "$keep"/
exit $rc"""


def _unshare() -> list[str]:
    return ["unshare", "-m"] if os.geteuid() == 0 else ["unshare", "-rm"]


@functools.lru_cache(maxsize=None)
def method() -> str:
    """"tmpfs" when a private tmpfs can be mounted here, else "rlimit"."""
    if os.environ.get("GRADTRACE_SMALL_FS") == "rlimit":
        return "rlimit"
    if shutil.which("unshare"):
        with tempfile.TemporaryDirectory() as d:
            try:
                p = subprocess.run([*_unshare(), "sh", "-c", 'mount -t tmpfs -o size=64k tmpfs "$1"', "sh", d],
                                   capture_output=True, timeout=30)
                if p.returncode == 0:
                    return "tmpfs"
            except (OSError, subprocess.TimeoutExpired):
                pass
    return "rlimit"


def run_on_small_fs(argv, mount_dir, size: int, keep_dir, **kwargs):
    """(CompletedProcess with text output, method). ``kwargs`` go to subprocess.run."""
    mount_dir, keep_dir = os.fspath(mount_dir), os.fspath(keep_dir)
    os.makedirs(mount_dir, exist_ok=True)
    os.makedirs(keep_dir, exist_ok=True)
    how = method()
    kwargs.setdefault("capture_output", True)
    kwargs.setdefault("text", True)
    if how == "tmpfs":
        p = subprocess.run([*_unshare(), "sh", "-c", _IN_NAMESPACE, "sh", mount_dir, keep_dir, str(size),
                            *map(str, argv)], **kwargs)
        if p.returncode == 97:
            raise RuntimeError(f"mounting a tmpfs on {mount_dir} failed: {p.stderr}")
        return p, how

    def limit():
        resource.setrlimit(resource.RLIMIT_FSIZE, (size // 2, size // 2))

    p = subprocess.run(list(map(str, argv)), preexec_fn=limit, **kwargs)
    shutil.copytree(mount_dir, keep_dir, dirs_exist_ok=True)
    return p, how
