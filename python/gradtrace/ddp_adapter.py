"""Capture a torch DistributedDataParallel run, in one call.

    model = DDP(net)
    opt = torch.optim.AdamW(model.parameters())
    cap = gradtrace.ddp_adapter.attach(model, "traces/run", optimizer=opt, loss="local-mean")
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

from .adapter_base import Capture, make_layout
from .rank_recorder import RankRecorder

__all__ = ["attach", "DDPCapture"]


class DDPCapture(Capture):
    def __init__(self, model, out_dir, optimizer=None, *, hook=None, hook_state=None, divisor=None, groups=None,
                 layout=None, **options):
        import torch

        from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

        group = model.process_group
        groups = {"dp": group, **(groups or {})}
        layout = make_layout(options, groups, layout)
        recorder = RankRecorder(model.module.named_parameters(), out_dir, framework="pytorch-ddp",
                                framework_version=torch.__version__.split("+")[0], layout=layout,
                                optimizer=optimizer,
                                config={"scaling": "mean" if hook is None else "", **options.pop("config", {})},
                                **options)
        super().__init__(recorder, model, optimizer)
        self.user_hook = hook or default_hooks.allreduce_hook
        self.hook_state = group if hook is None else hook_state
        # torch's allreduce_hook divides the sum by the group size; a hook of the user's is unknown (0).
        self.divisor = divisor if divisor is not None else (len(layout.groups["dp"]) if hook is None else 0)
        self.unmapped = 0
        model.register_comm_hook(self.hook_state, self._hook)

    def _hook(self, state, bucket):
        rec = self.recorder
        if not (rec.wants("PRE_REDUCE") or rec.wants("POST_REDUCE")):
            return self.user_hook(state, bucket)
        layout = self._bucket_layout(bucket)
        pre = bucket.buffer().detach().clone() if layout is not None else None
        fut = self.user_hook(state, bucket)
        if layout is None:
            return fut

        def record(f):
            result = f.value()
            post = result[0] if isinstance(result, (list, tuple)) else result
            numel = pre.numel()
            for phase, flat in (("PRE_REDUCE", pre), ("POST_REDUCE", post.detach().reshape(-1))):
                rec.write_bucket(phase, [(pid, 0, flat[off:off + n]) for pid, off, n in layout], group="dp",
                                 bucket_id=bucket.index(), bucket_numel=numel,
                                 divisor=self.divisor if phase == "POST_REDUCE" else 0.0)
            return result

        return fut.then(record)

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
    """Attach to a DistributedDataParallel ``model`` (before its first backward) and open this
    rank's ``out_dir/rank-NNNNN.gtrace``. ``optimizer``: FINAL and the step count follow its
    ``step()`` (else call ``cap.step()``). Keywords: ``hook``/``hook_state`` (your comm hook, run
    inside the recording one), ``divisor`` (what your hook divides by, recorded on POST_REDUCE),
    ``groups`` (more named process groups), layout overrides (``dp``, ``gas``, ``rules``, ... or
    ``layout=``), and the RankRecorder's options (``mode``, ``steps``, ``params``, ``run_id``,
    ``loss``, ``loss_description``, ``config``, ``extra``)."""
    return DDPCapture(model, out_dir, optimizer, **options)
