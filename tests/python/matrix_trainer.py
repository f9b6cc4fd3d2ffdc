"""A small trainer written the way torchtitan is, for gradtrace-matrix's tests: it reads its layout from
GRADTRACE_LAYOUT and builds it: FSDP2 (fully_shard over the dp mesh dim) for dp, DTensor tensor parallelism
(parallelize_module: ColwiseParallel fc1, RowwiseParallel fc2) for tp, both on one 2-D DeviceMesh, a
torch.distributed.pipelining GPipe schedule for pp, and gradient accumulation over gas micro-batches. Every
layout trains the same weights on the same global batch per optimizer step, so every layout's gradients
equal the one-process run's. Captured with gradtrace.attach into GRADTRACE_OUT_DIR.

    --bug tp-norm   a planted bug in one axis: with tp > 1 the norms' gradients (replicated parameters, already
                    whole on every tp rank) are all-reduced (summed) over tp again, as if they were partial

Declines (exit 77, gradtrace-matrix's "skip") a pipeline combined with dp or tp, which it does not build.
"""

import argparse
import json
import os
import sys

import torch
import torch.distributed as dist

VOCAB, HIDDEN, SEQ, BATCH, LAYERS = 32, 16, 8, 8, 2
DECLINE = 77


class Block(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = torch.nn.LayerNorm(HIDDEN)
        self.fc1 = torch.nn.Linear(HIDDEN, 2 * HIDDEN)
        self.fc2 = torch.nn.Linear(2 * HIDDEN, HIDDEN)

    def forward(self, x):
        return x + self.fc2(torch.tanh(self.fc1(self.norm(x))))


class Net(torch.nn.Module):
    def __init__(self, stage=None, stages=1):
        """The whole model (stage None), or what pipeline stage ``stage`` of ``stages`` holds."""
        super().__init__()
        first, last = stage in (None, 0), stage in (None, stages - 1)
        per = LAYERS // stages
        held = range(LAYERS) if stage is None else range(stage * per, (stage + 1) * per)
        self.embed = torch.nn.Embedding(VOCAB, HIDDEN) if first else None
        self.layers = torch.nn.ModuleDict({str(i): Block() for i in held})
        self.norm = torch.nn.LayerNorm(HIDDEN) if last else None
        self.head = torch.nn.Linear(HIDDEN, VOCAB) if last else None

    def forward(self, x):
        if self.embed is not None:
            x = self.embed(x)
        for layer in self.layers.values():
            x = layer(x)
        return self.head(self.norm(x)) if self.head is not None else x


def whole_model_then(stage=None, stages=1):
    """Seed 0's whole model, cut to a stage: every layout starts from the same weights."""
    torch.manual_seed(0)
    whole = Net()
    if stage is None:
        return whole
    part = Net(stage, stages)
    part.load_state_dict({k: v for k, v in whole.state_dict().items() if k in part.state_dict()})
    return part


def global_batch(step):
    g = torch.Generator().manual_seed(100 + step)
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=g), torch.randint(0, VOCAB, (BATCH, SEQ), generator=g)


def loss_fn(logits, labels):
    return torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), labels.reshape(-1))


def norms(model):
    return [p for n, p in model.named_parameters() if ".norm." in f".{n}" or n.startswith("norm.")]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=int(os.environ.get("GRADTRACE_STEPS", "2")))
    ap.add_argument("--bug", choices=["", "tp-norm"], default="")
    args = ap.parse_args()
    layout = json.loads(os.environ["GRADTRACE_LAYOUT"])
    dp, tp, pp, gas = (int(layout.get(k, 1)) for k in ("dp", "tp", "pp", "gas"))
    if pp > 1 and dp * tp > 1:
        print(f"matrix_trainer: pp={pp} with dp={dp}, tp={tp} is not built here", file=sys.stderr)
        sys.exit(DECLINE)
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    assert world == dp * tp * pp, (world, layout)
    import gradtrace

    out = os.environ["GRADTRACE_OUT_DIR"]
    dp_rank, tp_group = 0, None
    if pp > 1:
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

        model = whole_model_then(rank, pp)
        stage = PipelineStage(model, rank, pp, torch.device("cpu"))
        schedule = ScheduleGPipe(stage, n_microbatches=2 * gas, loss_fn=loss_fn)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(schedule, out, optimizer=opt, loss="local-mean")
    else:
        model = whole_model_then()
        if world > 1:
            from torch.distributed.device_mesh import init_device_mesh

            mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
            dp_rank, tp_group = mesh.get_local_rank("dp"), mesh["tp"].get_group()
            if tp > 1:
                from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

                for block in model.layers.values():
                    parallelize_module(block, mesh["tp"], {"fc1": ColwiseParallel(), "fc2": RowwiseParallel()})
            if dp > 1:
                from torch.distributed.fsdp import fully_shard

                for block in model.layers.values():
                    fully_shard(block, mesh=mesh["dp"])
                fully_shard(model, mesh=mesh["dp"])
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        cap = gradtrace.attach(model, out, optimizer=opt, loss="local-mean", gas=gas)
    rows = BATCH // dp
    for step in range(args.steps):
        tokens, labels = (t[dp_rank * rows:(dp_rank + 1) * rows] for t in global_batch(step))
        if pp > 1:
            losses = []
            schedule.step(tokens) if rank == 0 else schedule.step(target=labels, losses=losses)
        else:
            for m in range(gas):
                mine = slice(m * rows // gas, (m + 1) * rows // gas)
                loss = loss_fn(model(tokens[mine]), labels[mine]) / gas
                cap.record_step(loss)
                loss.backward()
        if args.bug == "tp-norm" and tp > 1:
            for p in norms(model):
                grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
                dist.all_reduce(grad, group=tp_group)
        opt.step()
        opt.zero_grad()
    cap.close()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
