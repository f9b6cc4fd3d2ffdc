"""Runs a user's script for the versions command the way `python SCRIPT ARGS...` would, with the runtime
patches the package's description names ("after_import": module -> function):

    python -m gradtrace.versions.script_main SCRIPT [ARGS...]     (runner._script starts each rank so)

A patch is made when the script itself imports its module, not before: the script keeps its own import order
and environment set-up. DeepSpeed's description patches deepspeed.comm.torch so that its CPU shared-memory comm
op, two minutes of g++ per DeepSpeed install, is not built (packages/deepspeed_hooks.py: skip_shm_build).
"""

import importlib.abc
import importlib.util
import os
import runpy
import sys


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of `module` so that `patch` (a "pkg.module:function" of the
    description) follows its import."""

    def __init__(self, module, patch, desc):
        self.module, self.patch, self.desc = module, patch, desc

    def find_spec(self, name, path, target=None):
        if name != self.module:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            self.desc.hook(self.patch)(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def main():
    if len(sys.argv) < 2:
        print("usage: python -m gradtrace.versions.script_main SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)  # what `python SCRIPT` puts first (-m put the working directory)
    if os.environ.get("GRADTRACE_PACKAGE"):
        from gradtrace.versions import packages
        desc = packages.describe(os.environ["GRADTRACE_PACKAGE"])
        for module, patch in desc["after_import"].items():
            sys.meta_path.insert(0, _PatchAfterImport(module, patch, desc))
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
