"""Import stub for the old-DeepSpeed environments of tools/repro/ds5248 (envs.py puts this folder on
their sys.path; the project's .venv never sees it).

DeepSpeed < 0.15 refuses DS_ACCELERATOR=cpu unless `import intel_extension_for_pytorch` succeeds
(deepspeed/accelerator/real_accelerator.py), although its CPU accelerator uses nothing from it on the
paths these runs take (torch tensors on CPU, gloo collectives, no fused ops: DS_BUILD_OPS=0). The real
package is not needed for the gradient reduction under study, so this stub only makes the import work.
"""

__version__ = "0.0.0+gradtrace.stub"


class _C:  # real_accelerator's auto-detection asks ipex._C._has_xpu()
    @staticmethod
    def _has_xpu():
        return False
__gradtrace_stub__ = True
