"""A gradtrace-versions script (its contract: python/gradtrace/versions/command.py) for DeepSpeed's PipelineEngine
with gradient accumulation: the model and data of tools/repro/upstream/ds_pipe.py, captured with gradtrace.attach(engine, ...).

    gradtrace-versions --package deepspeed --script tools/repro/ds_pipe/capture.py \
        --config tools/repro/ds_pipe/ds_pipe.json --sp 1 --dp 2 --releases 0.18.0,0.19.2,0.19.8

WORLD_SIZE ranks are that many pipeline stages (--dp 2: two stages, data-parallel degree 1), one optimizer step
of gas (the config's, GRADTRACE_CONFIG) micro-batches of 4 samples through engine.train_batch. On one rank (the command's
single-rank reference) the same 3-linear-layer model trains unpipelined as an nn.Sequential (its parameters are
named as PipelineModule names them: "0.weight", ...) on the same samples at once, gas 1, through a DeepSpeedEngine.
"""
import importlib
import json
import os

import deepspeed
import torch
from torch.nn.functional import cross_entropy

import gradtrace

CONFIG = json.load(open(os.environ["GRADTRACE_CONFIG"]))
# 4 samples per micro-batch, whatever the config says: for the single-rank reference the command multiplies the
# config's micro-batch by --dp, which here counts pipeline stages, not data-parallel replicas.
GAS, MB = CONFIG["gradient_accumulation_steps"], 4


def layers():
    torch.manual_seed(0)
    return [torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 16), torch.nn.Tanh(), torch.nn.Linear(16, 4)]


def data():
    g = torch.Generator().manual_seed(7)
    return torch.randn(GAS * MB, 8, generator=g), torch.randint(0, 4, (GAS * MB,), generator=g)


importlib.import_module("deepspeed.comm.torch").build_shm_op = lambda: None  # skip a JIT build used by inference
deepspeed.init_distributed(dist_backend="gloo")
stages = int(os.environ["WORLD_SIZE"])
x, y = data()
out = os.environ["GRADTRACE_OUT_DIR"]
if stages == 1:
    net = torch.nn.Sequential(*layers())
    cfg = {**CONFIG, "train_micro_batch_size_per_gpu": GAS * MB, "gradient_accumulation_steps": 1}
    engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), config=cfg)
    cap = gradtrace.attach(engine, out, loss="local-mean")
    loss = cross_entropy(engine(x), y)
    engine.backward(loss)
    cap.record_step(loss, 0)
    engine.step()
else:
    from deepspeed.pipe import PipelineModule

    net = PipelineModule(layers=layers(), num_stages=stages, loss_fn=cross_entropy, partition_method="uniform")
    cfg = {**CONFIG, "train_micro_batch_size_per_gpu": MB}
    engine, *_ = deepspeed.initialize(model=net, optimizer=torch.optim.SGD(net.parameters(), lr=0.1), config=cfg)
    cap = gradtrace.attach(engine, out, loss="local-mean")
    engine.train_batch(data_iter=iter([(x[k * MB:(k + 1) * MB], y[k * MB:(k + 1) * MB]) for k in range(GAS)]))
cap.close()
torch.distributed.destroy_process_group()
