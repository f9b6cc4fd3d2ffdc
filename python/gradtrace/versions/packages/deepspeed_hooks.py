"""The functions DeepSpeed's description (deepspeed.json) names: what cannot be written as data. Nothing here
imports torch or DeepSpeed."""

import json
import pathlib

from gradtrace.adapters import loss_recipes


def skip_shm_build(ds_torch_comm):
    """After `import deepspeed.comm.torch` (a user's script imports it; versions/script_main.py calls this):
    DeepSpeed's TorchBackend JIT-compiles its CPU shared-memory comm op when `deepspeed.init_distributed` creates
    it, two minutes of g++ per DeepSpeed install, redone whenever another install built the op into the same
    ~/.cache/torch_extensions (every release environment of a study does). Only inference_all_reduce uses that
    op; training collectives go to torch.distributed (gloo) whether it exists or not. Skip the build. Runtime
    patch only: DeepSpeed's files are untouched."""
    if hasattr(ds_torch_comm, "build_shm_op"):
        ds_torch_comm.build_shm_op = lambda: None


def disable_shm_comm_op():
    """skip_shm_build on deepspeed.comm.torch, imported now (for a loop that imports DeepSpeed itself)."""
    import importlib
    try:
        # Not `import deepspeed.comm.torch as m`: deepspeed.comm re-exports `torch`, and that form binds the
        # torch package instead of the submodule.
        ds_torch_comm = importlib.import_module("deepspeed.comm.torch")
    except ImportError:
        return
    skip_shm_build(ds_torch_comm)


def emulation_command(train_binary, config_path, sp: int, dp: int, loss: str, release: str, out) -> list:
    """--emulation: gradtrace-train --scaling deepspeed@RELEASE (the C++ emulation of that release's reduction)
    on the layout and the DeepSpeed config's stage, micro-batch, gas and bucket size."""
    cfg = json.loads(pathlib.Path(config_path).read_text())
    zero = cfg.get("zero_optimization", {})
    micro = int(cfg.get("train_micro_batch_size_per_gpu", 1))
    return [str(train_binary), "--nproc", str(sp * dp), "--sp", str(sp), "--dp", str(dp),
            "--zero-stage", str(zero.get("stage", 0)), "--scaling", f"deepspeed@{release}",
            "--loss", loss_recipes.ALIASES.get(loss, loss), "--batch", str(micro * dp),
            "--gas", str(cfg.get("gradient_accumulation_steps", 1)), "--steps", "1",
            "--reduce-bucket-size", str(zero.get("reduce_bucket_size", 2000)), "--out", str(out)]
