#!/usr/bin/env python3
"""DeepSpeed #7718 / #7749 on CPU: a Hugging Face Trainer run with ZeRO-2 and gradient accumulation,
captured with gradtrace.attach(trainer), whose callback attaches the DeepSpeed capture to Trainer's
engine (FINAL gradients + DeepSpeed's get_global_grad_norm()).

    python tools/repro/ds7718/train_hf_zero2.py --config tools/repro/ds7718/zero2_bf16_overlap.json \
        --out OUT [--world 2] [--steps 3]
    gradtrace-deepspeed-versions --config tools/repro/ds7718/zero2_bf16_overlap.json \
        --script tools/repro/ds7718/train_hf_zero2.py --dp 2 --sp 1 --releases ...

Both reports are Trainer runs (their logs are Trainer's `{'loss', 'grad_norm', ...}` lines): ZeRO-2,
seed 42, DeepSpeed's reported norm logged as grad_norm. Here: a config-built 2-layer Llama (no
download), fixed random tokens, AdamW (Trainer's default), gloo on 127.0.0.1, DS_ACCELERATOR=cpu.
Trainer's arguments come from the DeepSpeed config (micro-batch, gradient_accumulation_steps, bf16,
gradient_clipping as max_grad_norm), which Trainer passes to DeepSpeed unchanged.

Run by gradtrace-deepspeed-versions (its script contract, python/gradtrace/versions/command.py) it
reads GRADTRACE_OUT_DIR and GRADTRACE_DS_CONFIG; started by hand without RANK in the environment it
spawns --world processes itself. Writes OUT/rank-NNNNN.gtrace (one per rank) and OUT/summary.json
(rank 0: versions, the config, the engine's settings as DeepSpeed read them, and per optimizer step
Trainer's logged loss and grad_norm).
"""

import argparse
import copy
import json
import os
import socket
import sys
import tempfile

VOCAB, LENGTH = 128, 16


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--config", default=os.environ.get("GRADTRACE_DS_CONFIG"), help="DeepSpeed config (JSON)")
    ap.add_argument("--out", default=os.environ.get("GRADTRACE_OUT_DIR"), help="trace directory")
    ap.add_argument("--world", type=int, default=2, help="ranks to spawn when started by hand")
    ap.add_argument("--steps", type=int, default=3, help="optimizer steps")
    ap.add_argument("--lr", type=float, default=1e-4)
    ap.add_argument("--phases", default="FINAL",
                    help="phases the adapter records (FINAL,POST_REDUCE for micro_check.py)")
    args = ap.parse_args(argv)
    if not args.config or not args.out:
        ap.error("--config and --out (or GRADTRACE_DS_CONFIG and GRADTRACE_OUT_DIR) are required")
    with open(args.config) as f:
        args.ds_config = json.load(f)
    return args


def trainer_settings(cfg):
    """Trainer's arguments that DeepSpeed's config fixes (Trainer checks that they agree)."""
    return {"per_device_train_batch_size": int(cfg["train_micro_batch_size_per_gpu"]),
            "gradient_accumulation_steps": int(cfg.get("gradient_accumulation_steps", 1)),
            "bf16": bool(cfg.get("bf16", {}).get("enabled", False)),
            "max_grad_norm": float(cfg.get("gradient_clipping", 0.0))}


def disable_shm_comm_op():
    """Skip DeepSpeed's JIT build of the CPU shared-memory comm op (used only by inference_all_reduce);
    the same runtime patch as tools/repro/ds5248/run.py, which says why importlib is needed."""
    import importlib
    try:
        m = importlib.import_module("deepspeed.comm.torch")
    except ImportError:
        return
    if hasattr(m, "build_shm_op"):
        m.build_shm_op = lambda: None


def run_rank(args):
    import torch
    torch.set_num_threads(1)
    import deepspeed
    disable_shm_comm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    import transformers
    from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    seed = 42  # both reports: seed 42
    transformers.set_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                         num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                                         tie_word_embeddings=False))
    ts = trainer_settings(args.ds_config)
    gas = ts["gradient_accumulation_steps"]
    n = ts["per_device_train_batch_size"] * gas * world * args.steps
    g = torch.Generator().manual_seed(7)
    data = [{"input_ids": t, "labels": t.clone()} for t in torch.randint(0, VOCAB, (n, LENGTH), generator=g)]
    summary = {"deepspeed": deepspeed.__version__, "torch": torch.__version__, "transformers": transformers.__version__,
               "world": world, "steps_run": args.steps, "lr": args.lr, "trainer": ts,
               "ds_config": copy.deepcopy(args.ds_config), "steps": []}
    import gradtrace
    with tempfile.TemporaryDirectory() as scratch:
        targs = TrainingArguments(output_dir=scratch, max_steps=args.steps, logging_steps=1, report_to=[],
                                  save_strategy="no", learning_rate=args.lr, seed=seed, lr_scheduler_type="constant",
                                  disable_tqdm=True, use_cpu=True, deepspeed=args.ds_config,
                                  dataloader_drop_last=True, **ts)
        trainer = Trainer(model=model, args=targs, train_dataset=data)
        cap = gradtrace.attach(trainer, args.out, phases=tuple(args.phases.split(",")), extra={"repro": "ds7718"})
        trainer.train()
    logged = [e for e in trainer.state.log_history if "grad_norm" in e]  # Trainer's log lines, one per step
    summary["steps"] = [{"step": e["step"], "loss": e.get("loss"), "grad_norm": e.get("grad_norm"),
                         "learning_rate": e.get("learning_rate")} for e in logged]
    summary["recorded"] = dict(cap.recorded)
    summary["unrecordable"] = dict(cap.capture.unrecordable)
    engine = trainer.model_wrapped
    summary["engine"] = {"zero_stage": int(engine.zero_optimization_stage()), "bf16": bool(engine.bfloat16_enabled()),
                         "gas": int(engine.gradient_accumulation_steps()), "optimizer": type(engine.optimizer).__name__,
                         "client_optimizer": type(getattr(engine.optimizer, "optimizer", engine.optimizer)).__name__,
                         "gradient_clipping": float(engine.gradient_clipping())}
    if rank == 0:
        with open(os.path.join(args.out, "summary.json"), "w") as f:
            json.dump(summary, f, indent=1, sort_keys=True)
            f.write("\n")


def spawn(args, argv):
    """Run --world copies of this script as ranks 0..world-1 (gloo on 127.0.0.1); worst exit status."""
    import subprocess
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    procs = []
    for r in range(args.world):
        env = dict(os.environ, RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE=str(args.world),
                   LOCAL_WORLD_SIZE=str(args.world), MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
                   DS_ACCELERATOR="cpu", OMP_NUM_THREADS="1",
                   GRADTRACE_RUN_ID=os.environ.get("GRADTRACE_RUN_ID", f"ds7718-{os.getpid()}-{port}"))
        procs.append(subprocess.Popen([sys.executable, os.path.abspath(__file__), *argv], env=env))
    return max(p.wait() for p in procs)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    if "RANK" not in os.environ:
        return spawn(args, argv)
    run_rank(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
