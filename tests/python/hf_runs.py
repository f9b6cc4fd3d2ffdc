"""A Hugging Face Trainer run captured by gradtrace.attach(trainer) (its GradtraceCallback), for the adapter tests:
a config-built one-layer Llama (no downloads), 4 samples = one global batch per step, SGD, on CPU;
WORLD processes (gloo DDP through accelerate) each take 4 / WORLD samples.

    python hf_runs.py WORLD OUT               # Trainer + gradtrace.attach(trainer, ...)
    python hf_runs.py WORLD OUT accelerate    # Accelerator.prepare + gradtrace.attach(accelerator, ...), no Trainer
    python hf_runs.py WORLD OUT accelerate S  # the same with a DeepSpeed plugin, ZeRO stage S

Accelerate without Trainer: each rank trains a small MLP on its own rows (rank r: inputs r + 1),
through the prepared model (DDP, or a DeepSpeed engine) and optimizer, with gradient accumulation 2.
"""

import os
import socket
import sys
import tempfile

import torch

from adapter_runs import start_ranks  # one harness for every runs script

SAMPLES, LENGTH, VOCAB = 4, 8, 32


def run_rank(rank, world, out, port):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    import gradtrace

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    g = torch.Generator().manual_seed(7)
    data = [{"input_ids": t, "labels": t.clone()} for t in torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=g)]
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(output_dir=scratch, per_device_train_batch_size=SAMPLES // world, max_steps=2,
                                 logging_steps=1, use_cpu=True, report_to=[], save_strategy="no", learning_rate=0.1,
                                 optim="sgd", lr_scheduler_type="constant", seed=0, disable_tqdm=True,
                                 ddp_backend="gloo" if world > 1 else None)
        trainer = Trainer(model=model, args=args, train_dataset=data)
        cap = gradtrace.attach(trainer, out, loss="global-token-weighted")  # adds its callback
        trainer.train()
        assert cap.recorded["FINAL"] == 2, cap  # the callback closed it at the end of training


def accelerator(deepspeed_stage):
    """Accelerate on CPU: DDP over gloo, or a DeepSpeed plugin (ZeRO ``deepspeed_stage``; DS_ACCELERATOR=cpu, gloo)."""
    from accelerate import Accelerator

    if not deepspeed_stage:
        return Accelerator(cpu=True, gradient_accumulation_steps=2)
    import deepspeed
    from accelerate.utils import DeepSpeedPlugin

    from gradtrace.versions.packages.deepspeed_hooks import disable_shm_comm_op

    disable_shm_comm_op()  # two minutes of g++ for an op training does not use
    deepspeed.init_distributed(dist_backend="gloo")
    config = {"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2,
              "zero_optimization": {"stage": deepspeed_stage}, "zero_allow_untested_optimizer": True}
    return Accelerator(deepspeed_plugin=DeepSpeedPlugin(hf_ds_config=config), gradient_accumulation_steps=2)


def run_accelerate_rank(rank, world, out, port, deepspeed_stage=0):
    os.environ.update(RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                      MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    import gradtrace

    acc = accelerator(deepspeed_stage)
    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))
    model, opt = acc.prepare(net, torch.optim.SGD(net.parameters(), lr=0.1))
    if not deepspeed_stage:  # under DDP the Accelerator keeps the module, not the DDP model it returned
        try:
            gradtrace.attach(acc, out, optimizer=opt)
            raise AssertionError("gradtrace.attach(accelerator) without model= under DDP did not refuse")
        except ValueError as e:
            assert str(e).startswith("gradtrace.attach: pass the model accelerator.prepare returned as model="), e
    cap = gradtrace.attach(acc, out, model=model, optimizer=opt, loss="local-mean")
    for _ in range(4):  # 2 optimizer steps of 2 micro-steps
        with acc.accumulate(model):
            loss = model(torch.full((2, 4), rank + 1.0)).pow(2).mean()
            acc.backward(loss)
            cap.record_step(loss, 2)
            opt.step()
            opt.zero_grad()
    cap.close()


def main():
    world, out = int(sys.argv[1]), sys.argv[2]
    target = run_accelerate_rank if sys.argv[3:4] == ["accelerate"] else run_rank
    extra = (int(sys.argv[4]),) if sys.argv[4:] else ()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    if world == 1:
        target(0, 1, out, port, *extra)
    else:
        start_ranks(target, (world, out, port, *extra), world)


if __name__ == "__main__":
    main()
