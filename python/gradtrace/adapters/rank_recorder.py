"""The one writer path every adapter shares: this rank's trace file.

A ``RankRecorder`` opens ``out_dir/rank-NNNNN.gtrace`` through
:class:`gradtrace.TraceWriter` (the C++ codec), with a RunInfo built from
the model's parameters (names, shapes and dtypes from the tensors), the
:class:`gradtrace.layout.Layout`, the versions of what ran, and a run id
that every rank agrees on. Adapters hand it gradient pieces and call
:meth:`record_step` / :meth:`end_optimizer_step`; it applies the ``steps``
and ``params`` filters and counts steps and micro-steps.

Capture never takes training down by default (``on_error="warn"``): a write error (a full disk,
EFBIG, permission, I/O) prints one warning on stderr naming the rank, the file and the error, and
capture stops on that rank while training goes on; the file keeps every complete frame written
before (a truncated trace). Nothing collective depends on it: the adapters' reductions and the
collectives FINAL may need run exactly as before, so the other ranks, still capturing, never wait
on this one. ``on_error="raise"`` raises the TraceError instead.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import re
import socket
import sys
import time
import uuid
import warnings
from contextlib import contextmanager

from .. import _gtcodec
from .._gtcodec import locked_by_writer
from ..codec.dtypes import torch_dtype_name
from ..codec.trace import TraceError, TraceWriter
from . import loss_recipes, no_gradient
from .layout import Layout

log = logging.getLogger("gradtrace")

PHASES = no_gradient.GRADIENT_PHASES


def rank_file(out_dir, rank: int) -> str:
    """``out_dir/rank-NNNNN.gtrace``: the name proto/rank_file.h gives rank ``rank``'s file."""
    return os.path.join(os.fspath(out_dir), _gtcodec.rank_file_name(int(rank)))


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


NO_FINAL_WARNING = ("gradtrace: no FINAL gradients were recorded: pass optimizer= to attach() or call cap.step() "
                    "after each optimizer step")


ON_ERROR = ("warn", "raise")


class GuardedWriter:
    """This rank's :class:`gradtrace.TraceWriter` as the adapters write through it: a TraceError from a
    write or from close goes to the recorder (:meth:`RankRecorder.write_failed`), which disables capture
    with one warning (``on_error="warn"``) or raises it (``"raise"``). After that, writes are dropped."""

    def __init__(self, recorder, writer):
        self._recorder = recorder
        self._writer = writer

    @property
    def path(self) -> str:
        """The recorder's trace file."""
        return self._recorder.path

    def write_step(self, step: dict) -> None:
        """Writes a StepInfo unless capture is disabled on this rank (or the step is not one to write); hands it
        to the guard."""
        if self._recorder.guard is not None:
            self._recorder.guard.observe_step(step)
        if self._writer is not None and self._recorder.file_wants(step.get("step", 0)):
            try:
                self._writer.write_step(step)
            except TraceError as e:
                self._recorder.write_failed(e)

    def write_bucket(self, record: dict) -> None:
        """Writes a bucket record unless capture is disabled on this rank (or the step is not one to write);
        hands it to the guard."""
        if self._recorder.guard is not None:
            self._recorder.guard.observe_bucket(record)
        if self._writer is not None and self._recorder.file_wants(record.get("step", 0)):
            try:
                self._writer.write_bucket(record)
            except TraceError as e:
                self._recorder.write_failed(e)

    def close(self) -> None:
        """Writes the index and closes the file (a failure as a write's); then drops every write."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except TraceError as e:
                self._recorder.write_failed(e, closing=True)

    def abandon(self) -> None:
        """After a write error: closes the file as it is (the codec ends it at its last complete frame),
        without raising."""
        writer, self._writer = self._writer, None
        if writer is not None:
            try:
                writer.close()
            except Exception:  # noqa: BLE001 - the error that disabled capture was reported already
                pass


def split_mode(mode: str) -> tuple[str | None, bool]:
    """("full"|"stats"|"sketch:K" or None, guard): ``mode`` is a capture mode, "guard", or a capture mode and
    "guard" joined by "+" ("stats+guard": one run both writes stats and is guarded)."""
    parts = [p.strip() for p in str(mode).split("+")]
    guarded = "guard" in parts
    rest = [p for p in parts if p != "guard"]
    if len(rest) > 1 or (not rest and not guarded) or any(not p for p in rest):
        raise ValueError(f"mode={mode!r}: expected 'full', 'stats', 'sketch:K', 'guard', or one of the first three "
                         "and 'guard' joined by '+' (e.g. 'stats+guard')")
    return (rest[0] if rest else None), guarded


def step_filter(steps):
    """None: every step; an int N: the first N; an iterable: those step numbers."""
    if steps is None:
        return lambda s: True
    if isinstance(steps, int):
        return lambda s: s < steps
    chosen = {int(s) for s in steps}
    return lambda s: s in chosen


def _comm_fields(comm_dtype) -> dict:
    """{"comm_dtype": name} for a declared communication dtype (any spelling), else nothing."""
    return {"comm_dtype": torch_dtype_name(comm_dtype) if not isinstance(comm_dtype, str) else comm_dtype} \
        if comm_dtype is not None else {}


def init_sketch(param, shape) -> list[float]:
    """The parameter's values now at the elements every producer sketches (ParamInfo.init_sketch,
    FORMAT.md 4.1), when this rank holds the whole parameter; [] for a shard (a DTensor, a
    hand-written or ZeRO-3 piece whose size is not the table's) or an empty one."""
    import torch

    from . import dtensor

    numel = 1
    for d in shape:
        numel *= int(d)
    if dtensor.is_dtensor(param) or param.numel() != numel or numel == 0:
        return []
    positions = torch.tensor(_gtcodec.init_sketch_positions(numel), dtype=torch.long, device=param.device)
    with torch.no_grad():
        values = param.detach().reshape(-1).index_select(0, positions).double().cpu().tolist()
    # proto JSON spells non-finite doubles as strings
    return [v if math.isfinite(v) else ("NaN" if v != v else ("Infinity" if v > 0 else "-Infinity")) for v in values]


def input_moments(args, kwargs) -> tuple[int, float, float] | None:
    """(count, sum, sum of squares) of the first tensor among a forward's inputs (positional first,
    then ``input_ids``, then any keyword), summed in double; None when there is none."""
    import torch

    from . import dtensor

    candidates = list(args or ())
    if kwargs:
        candidates += [kwargs[k] for k in ("input_ids",) if k in kwargs] + list(kwargs.values())
    for x in candidates:
        if isinstance(x, torch.Tensor) and x.numel() > 0 and not x.is_complex():
            if dtensor.is_dtensor(x):
                x = x.to_local()
            with torch.no_grad():
                d = x.detach().double()
                return int(d.numel()), float(d.sum()), float(d.square().sum())
    return None


class RankRecorder:
    """This rank's trace. ``named_params``: (name, parameter) pairs, e.g. ``model.named_parameters()``
    (parameters without requires_grad are left out). Options: ``mode`` ("full", "sketch:K",
    "stats"), ``steps`` (which optimizer steps to capture: None = all, N = the first N, or a list),
    ``params`` (a regex: only matching parameters are written; the table keeps them all so that
    fingerprints agree), ``phases``, ``run_id``, ``loss`` (the recipe's name), ``loss_description``
    (in words), ``config`` (more Config fields), ``extra`` (RunInfo.extra), ``shape_of`` (a parameter's
    full shape when its tensor is a placeholder, as ZeRO-3's are), and format 1.4's dtype chain:
    ``comm_dtype`` (the dtype gradients are communicated in, e.g. a compression hook's), ``comm_hook``
    (the hook's name), ``grad_dtype`` and ``accum_dtype`` (default: each parameter's own dtype).
    ``on_error``: "warn" (the default: a write error disables capture on this rank with one warning,
    training goes on) or "raise" (TraceError). ``overwrite``: replace a finished trace at this rank's
    path (without it one there is refused, whatever ``on_error``; a trace another writer is still
    writing is refused even with it).

    ``micro_steps``: the forwards (``begin_micro_step`` calls) of each optimizer step ended so far;
    ``inferred_gas`` their common count. :meth:`warn_unfinished` (adapters call it at close) warns
    about a run that recorded no FINAL, requested steps never reached, and a gas not given that the
    micro-steps contradict."""

    def __init__(self, named_params, out_dir, *, framework: str, framework_version: str = "",
                 layout: Layout | None = None, packages=(), mode: str = "full", steps=None, params: str | None = None,
                 phases=PHASES, run_id: str | None = None, loss: str = "", loss_description: str = "",
                 config: dict | None = None, extra: dict | None = None, optimizer=None, producer: str = "",
                 producer_version: str = "", shape_of=None, comm_dtype=None, comm_hook: str = "", grad_dtype=None,
                 accum_dtype=None, on_error: str = "warn", overwrite: bool = False, pipeline=None,
                 on_violation="warn", guard_every: int = 1, guard_timeout: float = 60.0, reference=None):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error={on_error!r}: expected one of {ON_ERROR}")
        file_mode, guarded = split_mode(mode)
        if guarded:
            from ..guard.guard import check_on_violation

            check_on_violation(on_violation)
        self.on_error = on_error
        self.guard = None  # gradtrace.guard.Guard with mode "guard" (alone or with a capture mode)
        self.disabled: str | None = None  # the write error that disabled capture on this rank
        loss_recipes.check(loss)
        if config and "loss" in config:
            loss_recipes.check(config["loss"], keyword='config["loss"]')
        self.layout = layout or Layout.infer()
        self.rank = self.layout.rank
        self.optimizer = optimizer
        self._start_counting(steps)
        self._param_regex = re.compile(params) if params else None
        self.pipeline = pipeline  # gradtrace.adapters.pipeline.PipelineInfo of a pipelined run, else None
        self.phases = set(phases)
        self.recorded = {"PRE_REDUCE": 0, "POST_REDUCE": 0, "FINAL": 0, "STEP": 0}
        table = self._param_table(named_params, shape_of, grad_dtype, accum_dtype, comm_dtype)
        self._written = [self._param_regex is None or bool(self._param_regex.search(n)) for n in self.names]
        cfg = {**self.layout.config(), **(pipeline.config() if pipeline else {}),
               "dtype": table[0]["dtype"] if table else "FP32", "backend": _backend(),
               "capture_mode": file_mode or "", "loss": loss, "loss_description": loss_description, **_comm_fields(comm_dtype),
               "comm_hook": comm_hook, **(config or {})}
        self.path = rank_file(out_dir, self.rank)
        self.run_info = self._run_info(table, cfg, agree_run_id(run_id), framework, framework_version, packages,
                                       producer, producer_version, extra)
        if file_mode is not None:
            self._open_writer(out_dir, file_mode, overwrite)
        else:
            self.writer = GuardedWriter(self, None)
        if guarded:
            from ..guard import Guard

            self.guard = Guard(self, out_dir, on_violation=on_violation, every=guard_every, timeout=guard_timeout,
                               reference=reference)

    def _start_counting(self, steps) -> None:
        """Step and micro-step counters, the ``steps`` filter, and the per-step input moments."""
        self.step = 0
        self.micro = 0
        self._last_micro = 0
        self._forward_seen = False
        self._reevaluating = False  # inside a later closure evaluation of the step (reevaluation())
        self._wanted_step = step_filter(steps)
        # steps=[...]: the steps asked for by number, checked at close (steps=N is an upper bound)
        self._requested = sorted({int(x) for x in steps}) if steps is not None and not isinstance(steps, int) else []
        self._forwards = 0  # begin_micro_step calls in the current optimizer step
        self._inputs = [0, 0.0, 0.0]  # count, sum, sum of squares of this step's inputs (input_moments)
        self.micro_steps: list[int] = []
        self._warned = False
        self._warned_skip = False
        self._checked_empty = False  # the first captured optimizer step was checked for gradient frames

    def _param_table(self, named_params, shape_of, grad_dtype, accum_dtype, comm_dtype) -> list[dict]:
        """RunInfo's parameter table (those with requires_grad, in order), filling ids, names, params and
        shapes; the init sketch of each parameter is read here, at attach."""
        self.ids: dict[int, int] = {}  # id(parameter) -> param table id
        self.names: list[str] = []
        self.params: list = []
        self.shapes: list[list[int]] = []  # full (global) shape per param id, as in the table
        # param id -> per dim, the global indices of the full parameter this rank's tensor holds (a hand-written
        # shard: manual_adapter's shards=); DTensors carry their own (gradtrace.adapters.dtensor)
        self.blocks: dict[int, list] = {}
        table = []
        for name, p in named_params:
            if not p.requires_grad:
                continue
            self.ids[id(p)] = len(self.params)
            self.names.append(name)
            self.params.append(p)
            shape = shape_of(p) if shape_of is not None else _full_shape(p)
            self.shapes.append([int(x) for x in shape])
            table.append({"name": name, "shape": shape, "dtype": torch_dtype_name(p.dtype),
                          "grad_dtype": torch_dtype_name(grad_dtype if grad_dtype is not None else p.dtype),
                          # .grad accumulates in the parameter's own dtype (FSDP2: in its sharded gradient's)
                          "accum_dtype": torch_dtype_name(accum_dtype if accum_dtype is not None else p.dtype),
                          **self.layout.param_fields(name),
                          **_comm_fields(comm_dtype), "init_sketch": init_sketch(p, shape)})
        return self._whole_model(table) if self.pipeline is not None else table

    def _whole_model(self, local: list[dict]) -> list[dict]:
        """A pipelined run's table: every stage's parameters (a collective over the pipeline group,
        gradtrace.adapters.pipeline.whole_table); this rank's parameters keep their tensors, the other
        stages' are None in ``params``."""
        from .pipeline import whole_table

        stage_of = self.pipeline.stage_of()
        table, index = whole_table(local, [stage_of[id(p)] for p in self.params], self.pipeline,
                                   self.layout.groups.get("pp", [self.rank]))
        params: list = [None] * len(table)
        for k, p in enumerate(self.params):
            params[index[k]] = p
        self.ids = {id(p): index[k] for k, p in enumerate(self.params)}
        self.params = params
        self.names = [e["name"] for e in table]
        self.shapes = [[int(x) for x in e["shape"]] for e in table]
        return table

    def _run_info(self, table, cfg, run_id, framework, framework_version, packages, producer, producer_version,
                  extra) -> dict:
        """This rank's RunInfo: the parameter table, Config ``cfg``, the versions of what ran."""
        versions = environment_versions(packages)
        return {
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
            "extra": {"argv": " ".join(sys.argv)[:4096],
                      **({"inferred": "; ".join(self.layout.inferred)} if self.layout.inferred else {}), **(extra or {})},
            **self.layout.run_fields(),
        }

    def _open_writer(self, out_dir, mode, overwrite) -> None:
        """Creates this rank's file. A failure is a write error (on_error decides), except that a trace
        already there is the user's choice to make (overwrite=, or another directory), not a write error:
        refused whatever on_error says, as is one a live writer holds."""
        self.writer = GuardedWriter(self, None)
        existed = os.path.isfile(self.path) and not os.path.islink(self.path)
        try:
            os.makedirs(out_dir, exist_ok=True)
            writer = TraceWriter(self.path, self.run_info, mode=mode, overwrite=overwrite)
        except (TraceError, OSError) as e:
            if self.on_error == "raise" or (existed and (not overwrite or locked_by_writer(self.path))):
                raise
            self.write_failed(e)
        else:
            self.writer = GuardedWriter(self, writer)
            self.run_info = writer.run_info

    def write_failed(self, error: Exception, closing: bool = False) -> None:
        """A write (or, ``closing``, the close) of this rank's trace failed: with ``on_error="raise"`` the
        error is raised; with "warn" capture stops here, once, with one warning on stderr, and the file is
        closed as it is. Never a collective: the other ranks' capture goes on."""
        if self.on_error == "raise":
            raise error
        if self.disabled is not None:
            return
        self.disabled = str(error)
        kept = (f"{self.path} keeps the frames written before: a truncated trace" if closing
                or self.writer._writer is not None else "no trace is written for this rank")
        # One write of the whole line: print() writes the newline separately, and two ranks' warnings then
        # shared a line on the common stderr.
        sys.stderr.write(f"gradtrace: WARNING: rank {self.rank}: capture disabled after a write error: {error}; "
                         f"training continues without capture ({kept})\n")
        sys.stderr.flush()
        if not closing:
            self.writer.abandon()

    # ---- what to capture -----------------------------------------------------------------------

    @property
    def capturing(self) -> bool:
        """Whether the current optimizer step is recorded: one the ``steps`` filter selects, or any under the
        guard."""
        return self.writer is not None and not self._reevaluating and self._records_step(self.step)

    def _records_step(self, step: int) -> bool:
        """Whether step ``step`` is recorded at all: the guard sees every step, the file those ``steps`` selects."""
        return self.guard is not None or self._wanted_step(step)

    def file_wants(self, step: int) -> bool:
        """Whether the trace file takes step ``step``'s records (the ``steps`` filter; the guard sees every step)."""
        return self._wanted_step(int(step))

    @property
    def _dropping(self) -> bool:
        """A write error disabled capture on this rank and no guard takes the records."""
        return self.disabled is not None and self.guard is None

    @contextmanager
    def reevaluation(self):
        """A later closure evaluation inside the same optimizer step (LBFGS; gradtrace.adapters.step_protocol):
        nothing of it is recorded and no micro-step is counted."""
        self._reevaluating = True
        try:
            yield
        finally:
            self._reevaluating = False

    def wants(self, phase: str) -> bool:
        """Whether ``phase`` is recorded now (asked for, and this step is captured)."""
        return phase in self.phases and self.capturing

    def param_id(self, param) -> int | None:
        """The parameter table's id of ``param``; None for one not in the table."""
        return self.ids.get(id(param))

    # ---- frames --------------------------------------------------------------------------------

    def write_bucket(self, phase: str, pieces, *, group: str = "", bucket_id: int = 0, bucket_numel: int = 0,
                     partition_offset: int = 0, partition_count: int = 0, divisor: float = 0.0,
                     micro: int | None = None) -> None:
        """One BucketRecord of the current step and micro-step (``micro``: an earlier micro-step of this step,
        for a record read after the next one began). ``pieces``: (param id, element offset, values tensor) in
        bucket order; parameters outside the ``params`` regex are left out."""
        if not self.wants(phase) or self._dropping:
            return
        slices = [{"param_id": pid, "offset": int(off), "values": values}
                  for pid, off, values in pieces if self._written[pid] and values.numel() > 0]
        if not slices:
            return
        self.writer.write_bucket({"step": self.step, "micro_step": self.micro if micro is None else int(micro),
                                  "bucket_id": int(bucket_id),
                                  "phase": phase, "group": group, "bucket_numel": int(bucket_numel),
                                  "partition_offset": int(partition_offset), "partition_count": int(partition_count),
                                  "divisor": float(divisor), "slices": slices})
        if self.disabled is None:
            self.recorded[phase] += 1

    def write_final(self, pieces=None) -> None:
        """FINAL of the current step. ``pieces`` as for :meth:`write_bucket`; default every
        parameter's whole ``.grad`` (parameters without one are left out). The pieces are taken
        (Partial DTensor gradients reduced: a collective) whether or not a write error disabled this
        rank's capture, so that every rank runs the same collectives."""
        if not self.wants("FINAL"):
            return
        if pieces is None:
            pieces = [x for k, p in enumerate(self.params) if p is not None and p.grad is not None and self._written[k]
                      for x in self.grad_pieces(k, p.grad, reduce=True)]
        self.write_bucket("FINAL", pieces, group="", bucket_id=0)

    def grad_pieces(self, pid: int, values, *, reduce: bool = False) -> list:
        """(param id, element offset, tensor) pieces of ``values``, parameter ``pid``'s gradient as
        this rank holds it: a DTensor gives its local tensor at its offsets in the flattened global
        parameter (with ``reduce``, Partial placements are reduced first: a collective every rank runs
        in the same order, as FINAL does; gradtrace.adapters.dtensor); a declared hand-written shard
        (``blocks``) its block's runs; anything else is the whole parameter at offset 0."""
        from . import dtensor

        if dtensor.is_dtensor(values):
            return dtensor.dtensor_pieces(pid, values, reduce=reduce)
        if pid in self.blocks:
            return dtensor.block_pieces(pid, values, self.shapes[pid], self.blocks[pid])
        spec = dtensor.param_spec(self.params[pid])
        if spec is not None:  # a DTensor parameter's local values (a flat bucket's, DDP x TP's local tensors)
            shape, mesh, placements = spec
            return dtensor.block_pieces(pid, values.detach(), shape, dtensor.local_index(shape, mesh, placements)[1])
        return [(pid, 0, values.detach())]

    def begin_micro_step(self, args=(), kwargs=None) -> None:
        """Called at each forward of the model: the second and later forwards before an optimizer
        step are micro-steps 1, 2, ... ``args``/``kwargs``: the forward's inputs, whose first tensor's
        moments go into the optimizer-step StepInfo (FORMAT.md 4.1: tells different data apart)."""
        if self._reevaluating:
            return
        if self._forward_seen:
            self.micro += 1
        self._forward_seen = True
        self._forwards += 1
        if self.capturing:
            moments = input_moments(args, kwargs)
            if moments is not None:
                self._inputs = [x + y for x, y in zip(self._inputs, moments)]

    def record_step(self, loss, valid_tokens=0, lr: float | None = None) -> None:
        """StepInfo of the current micro-step: this rank's loss as passed to backward, its valid tokens."""
        if not self.capturing or self._dropping:
            return
        self.writer.write_step({"step": self.step, "micro_step": self.micro, "loss": _number(loss),
                                "valid_tokens": int(_number(valid_tokens)), "lr": self._lr(lr)})
        if self.disabled is None:
            self.recorded["STEP"] += 1

    def write_optimizer_step(self, grad_norm=None, lr: float | None = None, step: int | None = None,
                             micro: int | None = None) -> None:
        """The StepInfo written after an optimizer step (``optimizer_step``), with the gradient norm
        the framework reported (None: none reported); ``step``/``micro`` default to the current ones
        (an earlier ``step``: its last micro-step)."""
        if micro is None:
            micro = self.micro if step is None or step == self.step else self._last_micro
        step = self.step if step is None else step
        if self.writer is None or not self._records_step(step):
            return
        frame = {"step": step, "micro_step": micro, "lr": self._lr(lr), "optimizer_step": True}
        if step == self.step and self._inputs[0] > 0:
            frame.update(input_count=int(self._inputs[0]), input_sum=self._inputs[1], input_sumsq=self._inputs[2])
        if grad_norm is not None:
            frame["reported_grad_norm"] = _number(grad_norm)
        self.writer.write_step(frame)

    def check_gradients_recorded(self) -> None:
        """At the end of the first captured optimizer step: one warning when no gradient frame was
        recorded (gradtrace.adapters.no_gradient), naming the reason."""
        if self._checked_empty or not self.capturing or self.disabled is not None:
            return
        self._checked_empty = True
        no_gradient.warn_if_none(self.recorded, self.phases, self.rank, self.step,
                                 lambda: no_gradient.reason(self.params, self._written))

    @property
    def forwards_this_step(self) -> int:
        """Micro-steps (begin_micro_step calls) since the current optimizer step began."""
        return self._forwards

    def skipped_step(self) -> None:
        """The optimizer did not step although micro-steps ran (gradtrace.adapters.step_protocol: a GradScaler
        skip): this step ends with no FINAL and no optimizer-step StepInfo, said once; the next is step + 1."""
        if not self._warned_skip:
            self._warned_skip = True
            warnings.warn(f"gradtrace: rank {self.rank}: the optimizer did not step in step {self.step} "
                          f"(zero_grad came after {self._forwards} micro-step(s) with no optimizer.step, e.g. a "
                          "GradScaler that found inf/NaN gradients): that step has no FINAL; the next optimizer step "
                          f"is recorded as step {self.step + 1}", stacklevel=4)
        self.next_step(check=False, skipped=True)

    def step_ended(self, step: int, skipped: bool = False) -> None:
        """Optimizer step ``step`` ended (``skipped``: without an update): the guard judges it. Adapters that count
        steps themselves (DeepSpeed) call it; :meth:`next_step` does for the others."""
        if self.guard is not None:
            self.guard.step_ended(step, skipped)

    def next_step(self, check: bool = True, skipped: bool = False) -> None:
        """Ends the optimizer step: checks (``check``) that it recorded gradients, has the guard judge it, then
        counts it."""
        if check:
            self.check_gradients_recorded()
        self.step_ended(self.step, skipped)
        if self.capturing and self.step % 10 == 0:
            log.info("gradtrace: rank %d captured step %d (%s)", self.rank, self.step, self.recorded)
        self.step += 1
        self._last_micro, self.micro = self.micro, 0
        self._forward_seen = False
        self.micro_steps.append(self._forwards)
        self._forwards = 0
        self._inputs = [0, 0.0, 0.0]

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

    @property
    def inferred_gas(self) -> int | None:
        """The micro-steps (forwards) every ended optimizer step had, when they all had the same
        number (> 0); None before the first optimizer step or when they differ."""
        counts = set(self.micro_steps)
        return counts.pop() if len(counts) == 1 and 0 not in counts else None

    def warn_unfinished(self, stacklevel: int = 2) -> None:
        """Once, at the end of a run (adapters call it from close()): warns when something was
        trained but no optimizer step ended and no FINAL was written (everything is step 0), when steps asked for
        with ``steps=[...]`` were never reached, and when gas was not given (Config.gas says 1) but
        every optimizer step ran the same number N > 1 of micro-steps."""
        if self._warned or self.writer is None or self.disabled is not None:
            return
        self._warned = True
        trained = self.step > 0 or self._forwards > 0 or any(self.recorded.values())
        if not trained:
            return
        if self.step == 0 and self.recorded["FINAL"] == 0 and "FINAL" in self.phases:
            warnings.warn(NO_FINAL_WARNING, stacklevel=stacklevel)
        missing = [s for s in self._requested if s >= self.step]
        if missing:
            last = f"the last step trained was {self.step - 1}" if self.step > 0 else "no optimizer step ended"
            warnings.warn(f"gradtrace: steps {missing} (of steps={self._requested}) were never reached: {last} "
                          f"(steps count from 0); the trace holds nothing of them", stacklevel=stacklevel)
        gas = self.inferred_gas
        microbatches = (self.pipeline.n_microbatches or 1) if self.pipeline is not None else 1
        if gas is not None and microbatches > 1 and gas % microbatches == 0:
            gas //= microbatches  # a pipeline's forwards are its micro-batches, gas x n_microbatches per step
        if not getattr(self.layout, "gas_given", True) and gas is not None and gas > 1:
            warnings.warn(f"gradtrace: gas was not given, so the trace records gas {self.layout.gas}, but every "
                          f"optimizer step ran {gas} micro-steps (forwards of the model): pass gas={gas} to attach()",
                          stacklevel=stacklevel)

    def close(self) -> None:
        """Closes the guard (its summary), writes the index and closes the file. Idempotent; with
        ``on_error="warn"`` it never raises (a failure disables capture with the one warning, as a write's)."""
        if self.guard is not None:
            try:
                self.guard.close()
            except Exception:  # noqa: BLE001 - the file is closed whatever the guard's last judgement raised
                self._close_file()
                raise
        self._close_file()

    def _close_file(self) -> None:
        if self.writer is not None:
            writer, self.writer = self.writer, None
            writer.close()


def _backend() -> str:
    """The default process group's backend, "" without one."""
    import torch.distributed as tdist

    return str(tdist.get_backend()) if tdist.is_available() and tdist.is_initialized() else ""


def _full_shape(p) -> list[int]:
    """A parameter's full shape: a DTensor's (global) shape, or the DTensorSpec's of DDP x TP's local tensors."""
    from .dtensor import param_spec

    spec = param_spec(p)
    return list(spec[0]) if spec is not None else list(p.shape)


def _number(x) -> float:
    if hasattr(x, "detach"):
        return float(x.detach().float().item())
    return float(x)
