"""Capture hand-written parallel training (your own SP/CP/EP/TP collectives, Megatron-like code).

    cap = gradtrace.manual_adapter.attach(model, "traces/cp2", optimizer=opt,
                                          groups={"cp": cp_group}, cp_kind="all-gather", loss="global-token-mean")
    loss.backward()
    with cap.around("cp", params):            # PRE_REDUCE before, POST_REDUCE after your collective
        for p in params:
            dist.all_reduce(p.grad, group=cp_group)
    opt.step()                                # FINAL: every parameter's .grad, before the step

FINAL comes from attaching to the optimizer (or ``cap.step()`` without one). PRE/POST come
from :meth:`ManualCapture.around` or :meth:`ManualCapture.record`, which take the parameters (their
``.grad``), explicit tensors, or one flat bucket tensor laid out as the parameters in order.
"""

from __future__ import annotations

from contextlib import contextmanager

from .adapter_base import Capture, make_layout
from .rank_recorder import RankRecorder

__all__ = ["attach", "ManualCapture"]


class ManualCapture(Capture):
    def __init__(self, model, out_dir, optimizer=None, *, groups=None, layout=None, framework: str = "pytorch",
                 framework_version: str | None = None, **options):
        import torch

        layout = make_layout(options, groups, layout)
        version = torch.__version__.split("+")[0] if framework_version is None else framework_version
        recorder = RankRecorder(model.named_parameters(), out_dir, framework=framework, framework_version=version,
                                layout=layout, optimizer=optimizer, **options)
        super().__init__(recorder, model, optimizer)
        self._bucket_key = None
        self._bucket_next = 0

    def _bucket_id(self, given):
        if given is not None:
            return given
        key = (self.recorder.step, self.recorder.micro)
        if key != self._bucket_key:
            self._bucket_key, self._bucket_next = key, 0
        self._bucket_next += 1
        return self._bucket_next - 1

    def _pieces(self, params, tensors, flat):
        rec = self.recorder
        out, off = [], 0
        for k, p in enumerate(params):
            pid = rec.param_id(p)
            if pid is None:
                raise ValueError(f"gradtrace: parameter {k} of the record is not a parameter of the attached model")
            if flat is not None:
                values = flat.detach().reshape(-1)[off:off + p.numel()]
                off += p.numel()
            else:
                values = (tensors[k] if tensors is not None else p.grad)
                if values is None:
                    continue
                values = values.detach()
            out.append((pid, 0, values))
        if flat is not None and off != flat.numel():
            raise ValueError(f"gradtrace: flat bucket has {flat.numel()} elements, the parameters {off}")
        return out

    def record(self, phase: str, group: str, params, *, tensors=None, flat=None, bucket_id=None,
               divisor: float = 0.0) -> None:
        """One BucketRecord now: ``phase`` ("PRE_REDUCE", "POST_REDUCE", "FINAL"), ``group`` (the
        name of the group reduced over, as in ``groups``), ``params`` (parameters of the model);
        values are their ``.grad``, or ``tensors`` (one per parameter), or ``flat`` (one tensor, the
        parameters' elements in order). ``divisor``: what the reduction divided by, if known."""
        params = list(params)
        pieces = self._pieces(params, tensors, flat)
        self.recorder.write_bucket(phase.upper(), pieces, group=group, bucket_id=self._bucket_id(bucket_id),
                                   bucket_numel=sum(p.numel() for p in params), divisor=divisor)

    @contextmanager
    def around(self, group: str, params, *, tensors=None, flat=None, bucket_id=None, divisor: float = 0.0):
        """PRE_REDUCE on entry and POST_REDUCE on exit, of the same values (reduced in place by the
        collective the block runs), with one bucket id."""
        params = list(params)
        bucket_id = self._bucket_id(bucket_id)
        self.record("PRE_REDUCE", group, params, tensors=tensors, flat=flat, bucket_id=bucket_id)
        yield self
        self.record("POST_REDUCE", group, params, tensors=tensors, flat=flat, bucket_id=bucket_id, divisor=divisor)


def attach(model, out_dir, optimizer=None, **options) -> ManualCapture:
    """Attach to any ``torch.nn.Module`` and open this rank's ``out_dir/rank-NNNNN.gtrace``.
    ``optimizer``: FINAL and the step count follow its ``step()`` (else call ``cap.step()``).
    Keywords: ``groups`` (name -> ProcessGroup or global ranks: "dp", "cp", "tp", ... set the
    degrees and this rank's coordinates), layout overrides (``dp``, ``cp``, ``cp_kind``, ``tp``,
    ``gas``, ``rules`` = [(regex, {"kind", "grad_group", "partition_dim", "shard_count"})],
    ``default_group``, or ``layout=``), ``framework`` (default "pytorch"), and the RankRecorder's
    options (``mode``, ``steps``, ``params``, ``run_id``, ``loss``, ``loss_description``,
    ``config``, ``extra``)."""
    return ManualCapture(model, out_dir, optimizer, **options)
