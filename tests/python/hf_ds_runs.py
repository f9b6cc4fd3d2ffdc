"""Hugging Face Trainer runs under DeepSpeed for tests/python/test_hf_deepspeed.py: a config-built one-layer
Llama (no downloads), 4 fixed samples = one global batch per optimizer step, gradient accumulation 2, SGD,
fp32, no clipping (DeepSpeed clips inside engine.step, after FINAL; Trainer before on_pre_optimizer_step),
2 optimizer steps, on CPU.

    python hf_ds_runs.py OUT 1                       # the reference: one process, no DeepSpeed, 2 samples a micro-step
    python hf_ds_runs.py OUT 2 --zero S [--capture C,...]   # 2 gloo ranks, ZeRO stage S, 1 sample a micro-step

Captures (each into OUT/C): ``callback`` gradtrace.attach(trainer) (its GradtraceCallback), the one-liner;
``adapter`` gradtrace.deepspeed_adapter attached to trainer.model_wrapped at on_train_begin (what the
ds7718 repro did before the callback could); ``grad`` what GradtraceCallback did before issue 26, every
``.grad`` at on_pre_optimizer_step, which ZeRO leaves empty.
"""

import argparse
import os
import socket
import sys
import tempfile

SAMPLES, LENGTH, VOCAB, GAS = 4, 8, 32, 2
LOSS = "global-token-weighted"  # Trainer's: the token count is gathered over ranks and micro-steps


def deepspeed_config(stage):
    return {"train_micro_batch_size_per_gpu": "auto", "train_batch_size": "auto",
            "gradient_accumulation_steps": "auto", "gradient_clipping": "auto",
            "zero_optimization": {"stage": stage}, "zero_allow_untested_optimizer": True}


def adapter_callback(out, box):
    """gradtrace.deepspeed_adapter on Trainer's engine, attached by hand."""
    from transformers import TrainerCallback

    import gradtrace

    class Adapter(TrainerCallback):
        cap = None

        def on_train_begin(self, args, state, control, model=None, **kw):
            engine = box[0].model_wrapped
            self.cap = gradtrace.attach(engine, out, loss=LOSS)
            model.register_forward_hook(self._forward, with_kwargs=True)

        def _forward(self, module, a, kwargs, output):
            if module.training:
                self.cap.begin_micro_step()
                self.cap.record_step(output.loss, int((kwargs["labels"] != -100).sum()))

        def on_train_end(self, args, state, control, **kw):
            self.cap.close()

    return Adapter()


def grad_callback(out):
    """GradtraceCallback before issue 26: losses at the forward, every .grad at on_pre_optimizer_step, the logged
    grad norm at on_log."""
    from transformers import TrainerCallback

    from gradtrace import Layout, RankRecorder

    class Grad(TrainerCallback):
        rec = None

        def on_train_begin(self, args, state, control, model=None, **kw):
            self.rec = RankRecorder(model.named_parameters(), out, framework="hf-trainer", layout=Layout.infer(gas=GAS))
            model.register_forward_hook(self._forward, with_kwargs=True)

        def _forward(self, module, a, kwargs, output):
            if module.training:
                self.rec.begin_micro_step()
                self.rec.record_step(output.loss, int((kwargs["labels"] != -100).sum()))

        def on_pre_optimizer_step(self, args, state, control, **kw):
            self.rec.write_final()

        def on_step_end(self, args, state, control, **kw):
            self.rec.next_step()

        def on_log(self, args, state, control, logs=None, **kw):
            if logs and "grad_norm" in logs:
                self.rec.write_optimizer_step(logs["grad_norm"], step=state.global_step - 1)

        def on_train_end(self, args, state, control, **kw):
            self.rec.close()

    return Grad()


def run_rank(rank, world, out, stage, captures):
    import torch
    torch.set_num_threads(1)
    if world > 1:
        import deepspeed

        from gradtrace.versions.packages.deepspeed_hooks import disable_shm_comm_op
        disable_shm_comm_op()  # two minutes of g++ for an op training does not use
        deepspeed.init_distributed(dist_backend="gloo")
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    import gradtrace

    torch.manual_seed(0)  # before TrainingArguments: no zero.Init, the same weights as the reference
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                         num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=32))
    g = torch.Generator().manual_seed(7)
    data = [{"input_ids": t, "labels": t.clone()} for t in torch.randint(0, VOCAB, (SAMPLES, LENGTH), generator=g)]
    box, callbacks = [], []
    for c in captures:
        path = os.path.join(out, c)
        if c != "callback":  # the one-liner is gradtrace.attach(trainer), below
            callbacks.append({"adapter": lambda: adapter_callback(path, box), "grad": lambda: grad_callback(path)}[c]())
    with tempfile.TemporaryDirectory() as scratch:
        args = TrainingArguments(output_dir=scratch, per_device_train_batch_size=SAMPLES // GAS // world,
                                 gradient_accumulation_steps=GAS, max_steps=2, logging_steps=1, use_cpu=True,
                                 report_to=[], save_strategy="no", learning_rate=0.1, optim="sgd",
                                 lr_scheduler_type="constant", seed=0, disable_tqdm=True, max_grad_norm=0.0,
                                 deepspeed=deepspeed_config(stage) if world > 1 else None)
        trainer = Trainer(model=model, args=args, train_dataset=data, callbacks=callbacks)
        if "callback" in captures:
            gradtrace.attach(trainer, os.path.join(out, "callback"), loss=LOSS)
        box.append(trainer)
        trainer.train()
    if world > 1:
        torch.distributed.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("world", type=int)
    ap.add_argument("--zero", type=int, default=0)
    ap.add_argument("--capture", default="callback")
    a = ap.parse_args()
    captures = a.capture.split(",")
    if a.world == 1 or "RANK" in os.environ:
        run_rank(int(os.environ.get("RANK", 0)), a.world, a.out, a.zero, captures)
        return 0
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), *sys.argv[1:]],
                              env=dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(a.world),
                                       LOCAL_WORLD_SIZE=str(a.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                                       OMP_NUM_THREADS="1", GRADTRACE_RUN_ID=f"hf-ds-{os.getpid()}-{port}"))
             for r in range(a.world)]
    return max(p.wait() for p in procs)


if __name__ == "__main__":
    sys.exit(main())
