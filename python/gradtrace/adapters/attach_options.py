"""The options of ``gradtrace.attach`` by the adapter that honours them, checked before anything is hooked:
an option an adapter cannot honour is an error naming it, never a warning after the fact."""

from __future__ import annotations

from . import loss_recipes

# Every capture takes RECORDER's options (the RankRecorder's); every PyTorch one TORCH's too (the layout).
GUARD = ("on_violation", "guard_every", "guard_timeout", "reference")
RECORDER = ("mode", "steps", "params", "loss", "loss_description", "on_error", "overwrite", "run_id", "config",
            "extra", "phases") + GUARD
TORCH = ("groups", "layout", "dp", "sp", "cp", "tp", "pp", "ep", "edp", "replicate", "cp_kind", "gas", "rules",
         "default_group", "default_kind", "comm_dtype")
DEEPSPEED = ("mode", "loss", "loss_description", "on_error", "overwrite", "run_id", "config", "extra", "phases") + GUARD
ACCEPTS = {
    "ddp": RECORDER + TORCH + ("optimizer", "hook", "hook_state", "divisor", "names_from"),
    "fsdp2": RECORDER + TORCH + ("optimizer", "full_final"),
    "module": RECORDER + TORCH + ("optimizer", "shards", "framework"),
    "deepspeed": DEEPSPEED + ("mpu",),
}
WHY_NOT = {
    "deepspeed": "a DeepSpeed engine records every step and parameter, and its layout comes from the engine "
                 "(and its mpu)",
}


def check_options(given: dict, backend: str, what: str, extra_ok=()) -> None:
    """ValueError naming the options in ``given`` that the ``backend``'s adapter cannot honour."""
    accepted = set(ACCEPTS[backend]) | set(extra_ok)
    refused = sorted(k for k in given if k not in accepted)
    if refused:
        why = WHY_NOT.get(backend, "")
        raise ValueError(f"gradtrace.attach: {', '.join(refused)} cannot be honoured for {what}"
                         f"{': ' + why if why else ''}; it accepts {', '.join(sorted(accepted))}")


def deepspeed_options(given: dict) -> dict:
    """The front door's options as DeepSpeedCapture's keywords: ``loss`` is its ``loss_recipe``, and
    ``loss_description`` a config field."""
    options = dict(given)
    config = dict(options.pop("config", None) or {})
    if "loss_description" in options:
        config["loss_description"] = options.pop("loss_description")
    if config:
        options["config"] = config
    if "loss" in options:  # checked under the name the caller used; DeepSpeed's loops' aliases are welcome
        options["loss_recipe"] = loss_recipes.check(options.pop("loss"), who="gradtrace.attach", aliases=True)
    return options
