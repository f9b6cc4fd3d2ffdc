"""The one writer path every adapter shares: this rank's trace file.

A ``RankRecorder`` opens ``out_dir/rank-NNNNN.gtrace`` through
:class:`gradtrace.TraceWriter` (the C++ codec), with a RunInfo built from
the model's parameters (names, shapes and dtypes from the tensors), the
:class:`gradtrace.layout.Layout`, the versions of what ran, and a run id
that every rank agrees on. Adapters hand it gradient pieces and call
:meth:`record_step` / :meth:`end_optimizer_step`; it applies the ``steps``
and ``params`` filters and counts steps and micro-steps.
"""

from __future__ import annotations

import logging
import os
import platform
import re
import socket
import sys
import time
import uuid

from .dtypes import torch_dtype_name
from .layout import Layout
from .trace import TraceWriter

log = logging.getLogger("gradtrace")

PHASES = ("PRE_REDUCE", "POST_REDUCE", "FINAL")


def rank_file(out_dir, rank: int) -> str:
    return os.path.join(os.fspath(out_dir), f"rank-{rank:05d}.gtrace")


def agree_run_id(run_id: str | None = None) -> str:
    """``run_id`` if given, else $GRADTRACE_RUN_ID, else one rank 0 draws and broadcasts over
    the default group (a collective: every rank calls this)."""
    if run_id:
        return run_id
    if os.environ.get("GRADTRACE_RUN_ID"):
        return os.environ["GRADTRACE_RUN_ID"]
    drawn = [uuid.uuid4().hex]
    import torch.distributed as tdist

    if tdist.is_available() and tdist.is_initialized() and tdist.get_world_size() > 1:
        tdist.broadcast_object_list(drawn, src=0)
    return drawn[0]


def environment_versions(packages=()) -> dict:
    """component -> version: torch, python, cuda and nccl when torch has them, and ``packages``
    (distribution names) that are installed."""
    import torch
    from importlib import metadata

    out = {"torch": torch.__version__, "python": platform.python_version()}
    if torch.version.cuda:
        out["cuda"] = torch.version.cuda
    try:
        if torch.cuda.is_available():
            out["nccl"] = ".".join(str(v) for v in torch.cuda.nccl.version())
    except Exception:  # noqa: BLE001 - a build without NCCL
        pass
    for name in packages:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            pass
    return out


def step_filter(steps):
    """None: every step; an int N: the first N; an iterable: those step numbers."""
    if steps is None:
        return lambda s: True
    if isinstance(steps, int):
        return lambda s: s < steps
    chosen = {int(s) for s in steps}
    return lambda s: s in chosen


class RankRecorder:
    """This rank's trace. ``named_params``: (name, parameter) pairs, e.g. ``model.named_parameters()``
    (parameters without requires_grad are left out). Options: ``mode`` ("full", "sketch:K",
    "stats"), ``steps`` (which optimizer steps to capture: None = all, N = the first N, or a list),
    ``params`` (a regex: only matching parameters are written; the table keeps them all so that
    fingerprints agree), ``phases``, ``run_id``, ``loss`` (the recipe's name), ``loss_description``
    (in words), ``config`` (more Config fields), ``extra`` (RunInfo.extra), ``shape_of`` (a parameter's
    full shape when its tensor is a placeholder, as ZeRO-3's are)."""

    def __init__(self, named_params, out_dir, *, framework: str, framework_version: str = "",
                 layout: Layout | None = None, packages=(), mode: str = "full", steps=None, params: str | None = None,
                 phases=PHASES, run_id: str | None = None, loss: str = "", loss_description: str = "",
                 config: dict | None = None, extra: dict | None = None, optimizer=None, producer: str = "",
                 producer_version: str = "", shape_of=None):
        import torch.distributed as tdist

        self.layout = layout or Layout.infer()
        self.rank = self.layout.rank
        self.optimizer = optimizer
        self.step = 0
        self.micro = 0
        self._last_micro = 0
        self._forward_seen = False
        self._wanted_step = step_filter(steps)
        self._param_regex = re.compile(params) if params else None
        self.phases = set(phases)
        self.recorded = {"PRE_REDUCE": 0, "POST_REDUCE": 0, "FINAL": 0, "STEP": 0}
        self.ids: dict[int, int] = {}  # id(parameter) -> param table id
        self.names: list[str] = []
        self.params: list = []
        table = []
        for name, p in named_params:
            if not p.requires_grad:
                continue
            self.ids[id(p)] = len(self.params)
            self.names.append(name)
            self.params.append(p)
            shape = shape_of(p) if shape_of is not None else list(p.shape)
            table.append({"name": name, "shape": shape, "dtype": torch_dtype_name(p.dtype),
                          **self.layout.param_fields(name)})
        self._written = [self._param_regex is None or bool(self._param_regex.search(n)) for n in self.names]
        run_id = agree_run_id(run_id)
        backend = str(tdist.get_backend()) if tdist.is_available() and tdist.is_initialized() else ""
        cfg = {**self.layout.config(), "dtype": table[0]["dtype"] if table else "FP32", "backend": backend,
               "capture_mode": mode, "loss": loss, "loss_description": loss_description}
        cfg.update(config or {})
        versions = environment_versions(packages)
        run_info = {
            "producer": producer or "gradtrace adapter",
            "producer_version": producer_version or f"{framework} {framework_version} / torch {versions['torch']}",
            "framework": framework,
            "framework_version": framework_version,
            "versions": versions,
            "run_id": run_id,
            "config": cfg,
            "rank": self.rank,
            "host": socket.gethostname(),
            "params": table,
            "created_unix_ns": time.time_ns(),
            "extra": {"argv": " ".join(sys.argv)[:4096], **(extra or {})},
            **self.layout.run_fields(),
        }
        os.makedirs(out_dir, exist_ok=True)
        self.path = rank_file(out_dir, self.rank)
        self.writer = TraceWriter(self.path, run_info, mode=mode)
        self.run_info = self.writer.run_info

    # ---- what to capture -----------------------------------------------------------------------

    @property
    def capturing(self) -> bool:
        """Whether the current optimizer step is one the ``steps`` filter selects."""
        return self.writer is not None and self._wanted_step(self.step)

    def wants(self, phase: str) -> bool:
        return phase in self.phases and self.capturing

    def param_id(self, param) -> int | None:
        return self.ids.get(id(param))

    # ---- frames --------------------------------------------------------------------------------

    def write_bucket(self, phase: str, pieces, *, group: str = "", bucket_id: int = 0, bucket_numel: int = 0,
                     partition_offset: int = 0, partition_count: int = 0, divisor: float = 0.0) -> None:
        """One BucketRecord of the current (step, micro-step). ``pieces``: (param id, element offset,
        values tensor) in bucket order; parameters outside the ``params`` regex are left out."""
        if not self.wants(phase):
            return
        slices = [{"param_id": pid, "offset": int(off), "values": values}
                  for pid, off, values in pieces if self._written[pid] and values.numel() > 0]
        if not slices:
            return
        self.writer.write_bucket({"step": self.step, "micro_step": self.micro, "bucket_id": int(bucket_id),
                                  "phase": phase, "group": group, "bucket_numel": int(bucket_numel),
                                  "partition_offset": int(partition_offset), "partition_count": int(partition_count),
                                  "divisor": float(divisor), "slices": slices})
        self.recorded[phase] += 1

    def write_final(self, pieces=None) -> None:
        """FINAL of the current step. ``pieces`` as for :meth:`write_bucket`; default every
        parameter's whole ``.grad`` (parameters without one are left out)."""
        if not self.wants("FINAL"):
            return
        if pieces is None:
            pieces = [(k, 0, p.grad.detach()) for k, p in enumerate(self.params) if p.grad is not None]
        self.write_bucket("FINAL", pieces, group="", bucket_id=0)

    def begin_micro_step(self) -> None:
        """Called at each forward of the model: the second and later forwards before an optimizer
        step are micro-steps 1, 2, ..."""
        if self._forward_seen:
            self.micro += 1
        self._forward_seen = True

    def record_step(self, loss, valid_tokens=0, lr: float | None = None) -> None:
        """StepInfo of the current micro-step: this rank's loss as passed to backward, its valid tokens."""
        if not self.capturing:
            return
        self.writer.write_step({"step": self.step, "micro_step": self.micro, "loss": _number(loss),
                                "valid_tokens": int(_number(valid_tokens)), "lr": self._lr(lr)})
        self.recorded["STEP"] += 1

    def write_optimizer_step(self, grad_norm=None, lr: float | None = None, step: int | None = None,
                             micro: int | None = None) -> None:
        """The StepInfo written after an optimizer step (``optimizer_step``), with the gradient norm
        the framework reported (None: none reported); ``step``/``micro`` default to the current ones
        (an earlier ``step``: its last micro-step)."""
        if micro is None:
            micro = self.micro if step is None or step == self.step else self._last_micro
        step = self.step if step is None else step
        if self.writer is None or not self._wanted_step(step):
            return
        frame = {"step": step, "micro_step": micro, "lr": self._lr(lr), "optimizer_step": True}
        if grad_norm is not None:
            frame["reported_grad_norm"] = _number(grad_norm)
        self.writer.write_step(frame)

    def next_step(self) -> None:
        if self.capturing and self.step % 10 == 0:
            log.info("gradtrace: rank %d captured step %d (%s)", self.rank, self.step, self.recorded)
        self.step += 1
        self._last_micro, self.micro = self.micro, 0
        self._forward_seen = False

    def end_optimizer_step(self, grad_norm=None, lr: float | None = None) -> None:
        """After the optimizer step: its StepInfo, then the next step begins."""
        self.write_optimizer_step(grad_norm, lr)
        self.next_step()

    def _lr(self, lr) -> float:
        if lr is not None:
            return float(lr)
        try:
            return float(self.optimizer.param_groups[0]["lr"])
        except Exception:  # noqa: BLE001 - no optimizer, or one without param_groups
            return 0.0

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None


def _number(x) -> float:
    if hasattr(x, "detach"):
        return float(x.detach().float().item())
    return float(x)


def optimizer_hooks(optimizer, before, after) -> list:
    """Runs ``before()`` ahead of every ``optimizer.step`` and ``after()`` behind it (torch's
    step hooks: the optimizer's class is not changed). A wrapper that is no torch optimizer itself
    (Accelerate's AcceleratedOptimizer, which skips the step while accumulating) is unwrapped to the
    optimizer it steps. Returns the handles."""
    while not hasattr(optimizer, "_optimizer_step_pre_hooks") and hasattr(optimizer, "optimizer"):
        optimizer = optimizer.optimizer
    return [optimizer.register_step_pre_hook(lambda *_: before()),
            optimizer.register_step_post_hook(lambda *_: after())]
