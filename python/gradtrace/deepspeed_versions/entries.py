"""DeepSpeed's built-in entry points for gradtrace-versions (gradtrace.versions.runner starts them):
`model:ds5248` / `model:moe`, the #5248 Ulysses loop (ds5248_run) with a tiny dense model or with every MLP
a deepspeed.moe.layer.MoE of 2 experts, and `emulation`, gradtrace-train --scaling deepspeed@RELEASE (the
C++ emulation of that release's reduction; checks the command without DeepSpeed environments).
Command lines and configs only: nothing here runs or imports torch."""

import importlib.util
import json
import pathlib

from gradtrace.adapters import loss_recipes

MOE_EXPERTS = 2
LOOP_MODULE = "gradtrace.deepspeed_versions.ds5248_run"  # the built-in #5248 loop, run with -m
# The modules that loop runs: their bytes key the cache of a model entry.
LOOP_SOURCES = (LOOP_MODULE, "gradtrace.deepspeed_versions.ds5248_model",
                "gradtrace.deepspeed_versions.ds5248_mpu", "gradtrace.adapters.deepspeed_adapter",
                "gradtrace.adapters.deepspeed_zero3")


def loop_sources() -> list:
    """The files of LOOP_SOURCES, found without importing them (the model and the adapter import torch)."""
    return [pathlib.Path(importlib.util.find_spec(m).origin) for m in LOOP_SOURCES]


def loop_command(python, model: str, sp: int, dp: int, config_path, loss: str, out, timeout: float) -> list:
    cmd = [str(python), "-m", LOOP_MODULE, "--sp", str(sp), "--dp", str(dp), "--ds-config", str(config_path),
           "--loss", loss, "--out", str(out), "--timeout", str(timeout)]
    return cmd + (["--moe-experts", str(MOE_EXPERTS)] if model == "moe" else [])


def emulation_command(train_binary, config_path, sp: int, dp: int, loss: str, release: str, out) -> list:
    cfg = json.loads(pathlib.Path(config_path).read_text())
    zero = cfg.get("zero_optimization", {})
    micro = int(cfg.get("train_micro_batch_size_per_gpu", 1))
    return [str(train_binary), "--nproc", str(sp * dp), "--sp", str(sp), "--dp", str(dp),
            "--zero-stage", str(zero.get("stage", 0)), "--scaling", f"deepspeed@{release}",
            "--loss", loss_recipes.ALIASES.get(loss, loss), "--batch", str(micro * dp),
            "--gas", str(cfg.get("gradient_accumulation_steps", 1)), "--steps", "1",
            "--reduce-bucket-size", str(zero.get("reduce_bucket_size", 2000)), "--out", str(out)]


def reference_config(cfg: dict, dp: int) -> dict:
    """The single-rank reference's DeepSpeed config: one rank takes the global batch (dp x micro-batch rows);
    train_batch_size is dropped so that DeepSpeed derives it for world 1."""
    ref = json.loads(json.dumps(cfg))
    ref["train_micro_batch_size_per_gpu"] = int(cfg.get("train_micro_batch_size_per_gpu", 1)) * dp
    ref.pop("train_batch_size", None)
    return ref
