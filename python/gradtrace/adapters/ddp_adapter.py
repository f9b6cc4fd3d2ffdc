"""Capture a torch DistributedDataParallel run, in one call.

    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters())
    cap = gradtrace.attach(model, "traces/run", optimizer=opt, loss="local-mean")
    for batch in data:
        loss = model(batch).mean(); loss.backward()
        cap.record_step(loss, valid_tokens)   # optional StepInfo of this micro-step
        opt.step(); opt.zero_grad()           # FINAL is written before the step runs
    cap.close()

PRE_REDUCE and POST_REDUCE come from a DDP communication hook: the bucket as DDP hands it to
the hook (each micro-step that communicates: ``no_sync`` micro-steps do not) and the tensor the
hook's future returns, sliced into its parameters. DDP takes one hook per model, so a hook of your
own is passed here (``hook=``, ``hook_state=``) and runs inside the recording one; the default is
torch's ``allreduce_hook`` (sum, then divide by the group size: what DDP does without a hook).
FINAL is every parameter's ``.grad`` before ``optimizer.step()`` (or at ``cap.step()``).
"""

from __future__ import annotations

from . import deprecation
from .adapter_base import TorchCapture, make_layout
from .rank_recorder import RankRecorder

__all__ = ["attach", "DDPCapture", "KNOWN_HOOKS"]

# The all-reduce works of the last backward the default hook recorded, (capture, step, micro) first. Never
# freed: an older backward's are freed here when the next one starts, the last ones never, so that
# the process group's thread, which drops its own reference to a work after the work completed
# (possibly only after this thread reached interpreter teardown), never drops the last one. Freeing
# a work needs the GIL (its saved thread-local state and its bucket tensor hold Python objects).
_LAST_WORKS: list = [None]
try:
    import ctypes

    ctypes.pythonapi.Py_IncRef(ctypes.py_object(_LAST_WORKS))  # kept through the teardown of this module
except (ImportError, AttributeError):  # not CPython: a module attribute
    pass

class _Waiter:
    """One daemon thread of gradtrace's that waits for the default hook's all-reduces and completes the futures
    DDP waits on: the hook returns at once (DDP overlaps communication with backward), and nothing of
    gradtrace's runs on the process group's thread. Idle, it blocks in a queue holding no Python object
    of torch's, so it has nothing to release at interpreter teardown."""

    def __init__(self):
        import queue
        import threading

        self._jobs = queue.SimpleQueue()
        threading.Thread(target=self._run, name="gradtrace-ddp-waiter", daemon=True).start()

    def complete_when_done(self, work, fut, value) -> None:
        self._jobs.put((work, fut, value))

    def _run(self) -> None:
        while True:
            work, fut, value = self._jobs.get()
            try:
                work.wait()
            except Exception as e:  # noqa: BLE001 - the collective's error is DDP's to raise, at its wait
                fut.set_exception(e)
            else:
                fut.set_result(value)
            del work, fut, value  # no reference kept while idle


_WAITER: list = []


def _waiter() -> _Waiter:
    if not _WAITER:
        _WAITER.append(_Waiter())
    return _WAITER[0]


# torch's communication hooks (torch.distributed.algorithms.ddp_comm_hooks) by function name, with the
# dtype their all-reduce travels in ("" = the gradient's own: PowerSGD's low-rank factors stay fp32 but
# approximate the sum). Each divides the sum by the group size, as the default all-reduce does.
KNOWN_HOOKS = {
    "allreduce_hook": "",
    "fp16_compress_hook": "fp16",
    "bf16_compress_hook": "bf16",
    "fp16_compress_wrapper_hook": "fp16",
    "bf16_compress_wrapper_hook": "bf16",
    "powerSGD_hook": "",
    "batched_powerSGD_hook": "",
}


def hook_name(hook) -> str:
    """A comm hook's function name (through functools.partial), "" for none."""
    while hasattr(hook, "func"):
        hook = hook.func
    return getattr(hook, "__name__", "") if hook is not None else ""


class DDPCapture(TorchCapture):
    """A DistributedDataParallel model's capture (``gradtrace.attach`` of a DDP model): PRE/POST_REDUCE per
    bucket from a comm hook that wraps yours, FINAL at the optimizer's step."""
    def __init__(self, model, out_dir, optimizer=None, *, hook=None, hook_state=None, divisor=None, groups=None,
                 layout=None, names_from=None, **options):
        import torch

        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
        from torch.nn.parallel import DistributedDataParallel

        from . import pipeline as pp

        info = pp.of(model)
        if info is not None:  # a pipeline whose stage is a DDP model (PipelineStage runs its no_sync)
            model = info.only_stage("ddp_adapter")
        if not isinstance(model, DistributedDataParallel):
            raise TypeError("gradtrace: expected a DistributedDataParallel model (wrap the model "
                            f"with DDP first), got {type(model).__name__}")
        # The module whose parameter names the trace uses: DDP's own, or one it wraps further down (Lightning's
        # LightningModule under its _LightningModuleWrapperBase), so that one-device and DDP traces diff without renames.
        named = (names_from if names_from is not None else model.module).named_parameters
        group = model.process_group
        groups = {"dp": group, **(groups or {})}
        if info is not None:
            groups = pp.layout_groups(info, groups)
        layout = make_layout(options, groups, layout, params=named())
        # torch's own hooks are known: their communication dtype and that they divide by the group size.
        known = KNOWN_HOOKS.get(hook_name(hook)) if hook is not None else None
        comm_dtype = options.pop("comm_dtype", None)
        if comm_dtype is None and known is not None:
            comm_dtype = known
        recorder = RankRecorder(named(), out_dir, framework="pytorch-ddp",
                                framework_version=torch.__version__.split("+")[0], layout=layout,
                                optimizer=optimizer,
                                config={"scaling": "mean" if hook is None or hook_name(hook) in KNOWN_HOOKS else "",
                                        **options.pop("config", {})},
                                comm_dtype=comm_dtype or None,
                                comm_hook=hook_name(hook) if hook_name(hook) in KNOWN_HOOKS else "", pipeline=info,
                                **options)
        super().__init__(recorder, model, optimizer)
        self.user_hook = hook or default_hooks.allreduce_hook
        self.hook_state = group if hook is None else hook_state
        # torch's hooks divide the sum by the group size; a hook of the user's is unknown (0).
        mean = hook is None or hook_name(hook) in KNOWN_HOOKS
        self.divisor = divisor if divisor is not None else (len(layout.groups["dp"]) if mean else 0)
        self.unmapped = 0
        self._own_hook = hook is None
        self._pending = []  # (step, micro, bucket id, layout, PRE or None, future) of this backward, until _flush
        model.register_comm_hook(self.hook_state, self._hook)

    # Clean exits: nothing of gradtrace's runs or is freed on the process group's thread. A
    # fut.then(record) callback ran there, and torch freed it there only after completing the future
    # DDP waits on; when that thread ran again only after the main thread had reached interpreter
    # teardown, taking the GIL made CPython end it with pthread_exit inside a noexcept destructor:
    # "terminate called without an active exception" (python/README.md, DDP). So the default
    # all-reduce's future is completed by gradtrace's own waiter thread (_Waiter; its works kept in
    # _LAST_WORKS), and POST (and a hook of the user's) is recorded in an autograd final callback on the
    # thread that runs backward.
    def _hook(self, state, bucket):
        rec = self.recorder
        if not (rec.wants("PRE_REDUCE") or rec.wants("POST_REDUCE")):
            return self.user_hook(state, bucket)
        layout = self._bucket_layout(bucket)
        if self._own_hook:
            # PRE is written (and taken by the guard) from the buffer itself before the all-reduce changes it in
            # place: no copy of the bucket (it was 21 MB a step on the guard's bench model, the guard's largest cost)
            if layout is not None:
                self._write_phase("PRE_REDUCE", bucket.index(), layout, bucket.buffer().detach())
            fut = self._allreduce_mean(state, bucket)
            if layout is not None:  # POST once the all-reduce is done, on this thread at the end of backward
                self._write_later(bucket.index(), layout, None, fut)
            return fut
        pre = bucket.buffer().detach().clone() if layout is not None else None
        fut = self.user_hook(state, bucket)
        if layout is not None:
            self._write_later(bucket.index(), layout, pre, fut)
        return fut

    def _write_later(self, index, layout, pre, fut) -> None:
        """Records the bucket (PRE from ``pre`` unless already written, POST from ``fut``) in an autograd final
        callback at the end of this backward, on the thread that runs it (queued once per bucket; the first
        drains)."""
        from torch.autograd import Variable

        self._pending.append((self.recorder.step, self.recorder.micro, index, layout, pre, fut))
        Variable._execution_engine.queue_callback(self._flush)

    def _allreduce_mean(self, group, bucket):
        """torch's allreduce_hook (divide by the group size, sum over the group), returned at once as a future
        that gradtrace's waiter thread completes when the all-reduce is done (_Waiter): DDP overlaps it with
        the rest of backward as it does without gradtrace, and no callback runs on the process group's thread;
        the work is kept in _LAST_WORKS."""
        import torch
        import torch.distributed as dist

        group = group if group is not None else dist.group.WORLD
        buf = bucket.buffer()
        buf.div_(group.size())
        work = dist.all_reduce(buf, group=group, async_op=True)
        key = (id(self), self.recorder.step, self.recorder.micro)
        if _LAST_WORKS[0] != key:
            _LAST_WORKS[:] = [key]
        _LAST_WORKS.append(work)
        fut = torch.futures.Future(devices=[buf.device] if buf.device.type != "cpu" else None)
        _waiter().complete_when_done(work, fut, buf)
        return fut

    def _flush(self):
        """The buckets of this backward (_write_later), once their futures are done."""
        rec = self.recorder
        pending, self._pending = self._pending, []
        for step, micro, index, layout, pre, fut in pending:
            if (step, micro) == (rec.step, rec.micro):  # else left by a backward that raised
                self._write(index, layout, pre, fut.wait())

    def _write(self, index, layout, pre, result):
        post = result[0] if isinstance(result, (list, tuple)) else result
        if pre is not None:  # the default hook wrote PRE before its all-reduce
            self._write_phase("PRE_REDUCE", index, layout, pre)
        self._write_phase("POST_REDUCE", index, layout, post.detach().reshape(-1))

    def _write_phase(self, phase, index, layout, flat):
        rec = self.recorder
        # DDP x TP: a parameter is this tp rank's local tensor, written at its offsets in the full one
        rec.write_bucket(phase, [x for pid, off, n in layout for x in rec.grad_pieces(pid, flat[off:off + n])],
                         group="dp", bucket_id=index, bucket_numel=flat.numel(),
                         divisor=self.divisor if phase == "POST_REDUCE" else 0.0)

    def close(self) -> None:
        """Drops records of a backward that raised, then closes as every capture does."""
        self._pending = []  # only a backward that raised leaves any
        super().close()

    def _bucket_layout(self, bucket):
        """[(param id, offset in the bucket buffer, numel)], or None when the bucket's parameters do
        not tile its buffer (then it is reduced but not recorded)."""
        out, off = [], 0
        for p in bucket.parameters():
            pid = self.recorder.param_id(p)
            if pid is None:
                break
            out.append((pid, off, p.numel()))
            off += p.numel()
        else:
            if off == bucket.buffer().numel():
                return out
        self.unmapped += 1
        return None


def attach(model, out_dir, optimizer=None, **options) -> DDPCapture:
    """Deprecated: use :func:`gradtrace.attach`, which takes the same options.

    Attach to a DistributedDataParallel ``model`` (before its first backward) and open this
    rank's ``out_dir/rank-NNNNN.gtrace``. ``optimizer``: FINAL and the step count follow its
    ``step()`` (else call ``cap.step()``). Keywords: ``hook``/``hook_state`` (your comm hook, run
    inside the recording one), ``divisor`` (what your hook divides by, recorded on POST_REDUCE),
    ``comm_dtype`` (the dtype your hook communicates in, e.g. "bf16"; torch's fp16/bf16 compression
    hooks and wrappers are recognised without it and recorded with their name, PowerSGD's too),
    ``groups`` (more named process groups), ``names_from`` (the module whose parameter names the trace
    uses, default ``model.module``: a module DDP wraps further down), layout overrides (``dp``, ``gas``, ``rules``, ... or
    ``layout=``), and the RankRecorder's options (``mode``, ``steps``, ``params``, ``run_id``,
    ``loss``, ``loss_description``, ``config``, ``extra``, ``on_error``: "warn" or "raise", ``overwrite``).
    ``model`` may also be a torch.distributed.pipelining schedule or PipelineStage whose one stage per rank
    is a DDP model: the trace then names the whole model with each parameter's stage (gradtrace.attach,
    Pipelines)."""
    deprecation.replaced_by_attach("gradtrace.ddp_adapter.attach", "gradtrace.attach(model, out_dir, optimizer=...)")
    return DDPCapture(model, out_dir, optimizer, **options)
