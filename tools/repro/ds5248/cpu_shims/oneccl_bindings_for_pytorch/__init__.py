"""Import stub for the old-DeepSpeed environments of tools/repro/ds5248 (see
../intel_extension_for_pytorch/__init__.py). DeepSpeed < 0.14 imports oneccl_bindings_for_pytorch at the
top of deepspeed/accelerator/cpu_accelerator.py; run.py initialises torch.distributed with gloo itself
(deepspeed.init_distributed(dist_backend="gloo")), so the oneCCL backend is never used.
"""

__gradtrace_stub__ = True  # run.py: with this stub the CPU accelerator is switched to gloo
