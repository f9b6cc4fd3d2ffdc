"""Runs a user's script for the versions command the way `python SCRIPT ARGS...` would, with one runtime
patch when the package under study is DeepSpeed:

    python -m gradtrace.versions.script_main SCRIPT [ARGS...]     (runner._script starts each rank so)

DeepSpeed's TorchBackend JIT-compiles its CPU shared-memory comm op when `deepspeed.init_distributed` creates
it: two minutes of g++ per DeepSpeed install, redone whenever another install built the op into the same
~/.cache/torch_extensions (every release environment of a study does). Only inference_all_reduce uses that op;
training collectives go to torch.distributed (gloo) whether it exists or not. The patch is the ds5248 loop's
(ds5248_run.skip_shm_build), made when the script itself imports deepspeed.comm.torch, not before: the script
keeps its own import order and environment set-up.
"""

import importlib.abc
import importlib.util
import os
import runpy
import sys

_PATCHED_MODULE = "deepspeed.comm.torch"


class _PatchAfterImport(importlib.abc.MetaPathFinder):
    """Finds nothing itself: wraps the real loader of deepspeed.comm.torch so the patch follows its import."""

    def find_spec(self, name, path, target=None):
        if name != _PATCHED_MODULE:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        exec_module = spec.loader.exec_module

        def exec_and_patch(module):
            exec_module(module)
            # Imported here, not at start-up: `import gradtrace` loads numpy and the codec before the script.
            from gradtrace.deepspeed_versions import ds5248_run
            ds5248_run.skip_shm_build(module)

        spec.loader.exec_module = exec_and_patch
        return spec


def main():
    if len(sys.argv) < 2:
        print("usage: python -m gradtrace.versions.script_main SCRIPT [ARGS...]", file=sys.stderr)
        return 2
    script = os.path.abspath(sys.argv[1])
    sys.argv = [script, *sys.argv[2:]]
    sys.path[0] = os.path.dirname(script)  # what `python SCRIPT` puts first (-m put the working directory)
    if os.environ.get("GRADTRACE_PACKAGE") == "deepspeed":
        sys.meta_path.insert(0, _PatchAfterImport())
    runpy.run_path(script, run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main())
