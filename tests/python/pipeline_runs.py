"""Pipeline-parallel runs on torch.distributed.pipelining, captured by manual_adapter.attach(schedule, ...),
for tests/python/test_pipeline_capture.py: one process per rank (gloo on 127.0.0.1, CPU), the same
weights and global batch at every layout, so a correct run's FINAL gradients equal the single-rank
reference's.

    python pipeline_runs.py KIND OUT [--pp P] [--dp D] [--ddp] [--no-scale-grads] [--tied | --tied-unsummed] [--steps N]

The model: embedding, four blocks (Linear + tanh), norm, head; each stage module is the whole model with
what other stages hold deleted (torchtitan's way), so its parameter names are the unpipelined model's.
Ranks: rank = dp_index x P + pipeline rank; each data-parallel replica takes its rows of the global batch
and all-reduces its stages' gradients over dp after the schedule's step (averaged: / D), recorded with
cap.around("dp", ...); with --ddp each stage module is a DistributedDataParallel model over dp instead (the
stage runs its no_sync; DDP averages in the last micro-batch's backward, before the schedule's scale_grads),
captured with ddp_adapter.attach(schedule, ...). The loss: cross entropy, the mean over each micro-batch (the
schedule's loss_fn).

KIND:
- ref: one rank, the whole model, the whole batch, one backward of the batch's mean loss.
- gpipe, 1f1b: ScheduleGPipe / Schedule1F1B over P stages (one per rank), 4 micro-batches.
- interleaved: ScheduleInterleaved1F1B, 2 stages per rank (2P stages), 4 micro-batches.
--per-stage: manual_adapter.attach(stage_module, ..., pp=P) instead of the schedule: each rank's table holds its
own stage only (what a user tries first; the diff refuses it and says how to attach).
--no-scale-grads: the schedule's scale_grads=False (the gradients are the sum over micro-batches of each
micro-batch's mean loss: 4x the reference).
--tied: the head reuses the embedding's weight (one parameter in the reference, "embed.weight"); the first
and the last stage each hold a copy and sum their gradients over the two (as Megatron's embedding group
does). --tied-unsummed: the copies are left with each stage's own share (each stage's optimizer then steps
its copy with part of the gradient).
"""

import argparse
import os
import sys

import torch
import torch.distributed as dist

from adapter_runs import free_port, start_ranks  # one harness for every runs script

VOCAB, HIDDEN, LAYERS, BATCH, SEQ, MICROBATCHES = 24, 16, 4, 8, 4, 4


class Net(torch.nn.Module):
    def __init__(self, tied=False):
        super().__init__()
        self.tied = tied
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN)
        self.layers = torch.nn.ModuleDict({str(i): torch.nn.Linear(HIDDEN, HIDDEN) for i in range(LAYERS)})
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.head = None if tied else torch.nn.Linear(HIDDEN, VOCAB, bias=False)
        with torch.no_grad():
            self.norm.weight.uniform_(0.5, 1.5)

    def forward(self, x):
        if x.dtype == torch.long:  # the first stage: tokens
            x = self.embed(x)
        for layer in self.layers.values():
            x = torch.tanh(layer(x))
        if self.norm is None:  # not the last stage: the activations go on
            return x
        x = self.norm(x)
        return torch.nn.functional.linear(x, self.embed.weight) if self.tied else self.head(x)


def stage_module(tied, stage, stages):
    """The whole model (seed 0) with what stage `stage` of `stages` does not hold deleted."""
    torch.manual_seed(0)
    model = Net(tied)
    per = LAYERS // stages
    for i in range(LAYERS):
        if not stage * per <= i < (stage + 1) * per:
            del model.layers[str(i)]
    last = stage == stages - 1
    if stage != 0 and not (tied and last):
        model.embed = None
    if not last:
        model.norm = None
        model.head = None
    return model


def batch(step):
    g = torch.Generator().manual_seed(100 + step)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)
    return tokens, torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loss_fn(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def run_ref(args):
    import gradtrace

    torch.manual_seed(0)
    model = Net(args.tied or args.tied_unsummed)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, args.out, optimizer=opt, loss="local-mean")
    for step in range(args.steps):
        tokens, labels = batch(step)
        loss = loss_fn(model(tokens), labels)
        loss.backward()
        cap.record_step(loss, labels.numel())
        opt.step()
        opt.zero_grad()
    cap.close()


def schedule_of(kind, stages, args):
    from torch.distributed.pipelining import Schedule1F1B, ScheduleGPipe, ScheduleInterleaved1F1B

    scale = not args.no_scale_grads
    if kind == "interleaved":
        return ScheduleInterleaved1F1B(stages, n_microbatches=MICROBATCHES, loss_fn=loss_fn, scale_grads=scale)
    cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
    return cls(stages[0], n_microbatches=MICROBATCHES, loss_fn=loss_fn, scale_grads=scale)


def fully_shard_over(module, dp_group):
    """fully_shard over the dp ranks (a 1-D mesh from the group): each block, then the stage module."""
    from torch.distributed.device_mesh import DeviceMesh
    from torch.distributed.fsdp import fully_shard

    mesh = DeviceMesh.from_group(dp_group, "cpu")
    for layer in module.layers.values():
        fully_shard(layer, mesh=mesh)
    return fully_shard(module, mesh=mesh)


def run_rank(rank, args):
    import gradtrace
    from torch.distributed.pipelining import PipelineStage

    world = args.pp * args.dp
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(args.port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pp_groups = [dist.new_group([d * args.pp + s for s in range(args.pp)]) for d in range(args.dp)]
    dp_groups = [dist.new_group([d * args.pp + s for d in range(args.dp)]) for s in range(args.pp)]
    dp_index, pp_rank = divmod(rank, args.pp)
    pp_group, dp_group = pp_groups[dp_index], dp_groups[pp_rank]
    per_rank = 2 if args.kind == "interleaved" else 1
    n_stages = args.pp * per_rank
    tied = args.tied or args.tied_unsummed
    indices = [pp_rank + k * args.pp for k in range(per_rank)]
    modules = [stage_module(tied, i, n_stages) for i in indices]
    wrapped = [torch.nn.parallel.DistributedDataParallel(m, process_group=dp_group) for m in modules] \
        if args.ddp else [fully_shard_over(m, dp_group) for m in modules] if args.fsdp2 else modules
    stages = [PipelineStage(m, i, n_stages, torch.device("cpu"), group=pp_group) for m, i in zip(wrapped, indices)]
    schedule = schedule_of(args.kind, stages, args)
    params = [p for m in wrapped for p in m.parameters()]
    opt = torch.optim.SGD(params, lr=0.1)
    if args.ddp:
        cap = gradtrace.attach(schedule, args.out, optimizer=opt, loss="local-mean")
    elif args.fsdp2:
        cap = gradtrace.attach(schedule, args.out, optimizer=opt, loss="local-mean")
    elif args.per_stage:  # what a user tried first: the stage module itself, the pipeline degree as a keyword
        cap = gradtrace.attach(modules[0], args.out, optimizer=opt, pp=args.pp, loss="local-mean")
    else:
        cap = gradtrace.attach(schedule, args.out, optimizer=opt, groups={"dp": dp_group},
                               loss="local-mean")
    rows = slice(dp_index * BATCH // args.dp, (dp_index + 1) * BATCH // args.dp)
    first, last = 0 in indices, n_stages - 1 in indices
    # The tied embedding's copies: the first stage's and the last stage's ranks of this replica.
    tie_groups = [dist.new_group([d * args.pp, d * args.pp + args.pp - 1]) for d in range(args.dp)] if tied else []
    for step in range(args.steps):
        tokens, labels = (t[rows] for t in batch(step))
        losses = []
        if first and last:
            schedule.step(tokens, target=labels, losses=losses)
        elif first:
            schedule.step(tokens)
        elif last:
            schedule.step(target=labels, losses=losses)
        else:
            schedule.step()
        if args.tied and (first or last):
            for m in modules:
                if m.embed is not None:
                    dist.all_reduce(m.embed.weight.grad, group=tie_groups[dp_index])
        if args.dp > 1 and not (args.ddp or args.fsdp2):
            with cap.around("dp", params):
                for p in params:
                    dist.all_reduce(p.grad, group=dp_group)
                    p.grad.div_(args.dp)
        if losses:
            cap.record_step(torch.stack(losses).mean(), labels.numel())
        opt.step()
        opt.zero_grad()
    cap.close()
    dist.destroy_process_group()


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("kind", choices=["ref", "gpipe", "1f1b", "interleaved"])
    ap.add_argument("out")
    ap.add_argument("--pp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--steps", type=int, default=2)
    ap.add_argument("--no-scale-grads", action="store_true")
    wrap = ap.add_mutually_exclusive_group()
    wrap.add_argument("--ddp", action="store_true")
    wrap.add_argument("--fsdp2", action="store_true")
    wrap.add_argument("--per-stage", action="store_true")
    ties = ap.add_mutually_exclusive_group()
    ties.add_argument("--tied", action="store_true")
    ties.add_argument("--tied-unsummed", action="store_true")
    args = ap.parse_args(argv)
    if args.kind == "ref":
        return run_ref(args)
    args.port = free_port()
    start_ranks(run_rank, (args,), args.pp * args.dp)


if __name__ == "__main__":
    sys.exit(main())
