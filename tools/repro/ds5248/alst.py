#!/usr/bin/env python3
"""DeepSpeed's own Ulysses recipe for Hugging Face models (ALST) on CPU, captured by gradtrace.attach.

    export PYTHONPATH=build/python
    .venv/bin/python tools/repro/ds5248/alst.py --sp 2 --out traces/alst-sp2                 # the ALST run
    .venv/bin/python tools/repro/ds5248/alst.py --sp 2 --reference --out traces/alst-ref     # its reference
    build/bin/gradtrace-diff traces/alst-ref traces/alst-sp2       # FINAL scale factor per parameter
    build/bin/gradtrace-diff --self traces/alst-sp2                # effective reduction divisor

The recipe is the one of DeepSpeed's tutorial "Arctic Long Sequence Training (ALST) for HF Transformers
integration" (docs/_tutorials/ulysses-alst-sequence-parallelism.md, https://www.deepspeed.ai/tutorials/
ulysses-alst-sequence-parallelism/): `UlyssesSPAttentionHF.register_with_transformers(...)` gives the mpu,
`deepspeed.initialize(..., mpu=mpu)`, a DataLoader wrapped by `UlyssesSPDataLoaderAdapter`, and the tutorial's
loss (the model's `loss_function` on the rank's pre-shifted labels, then the "differentiable weighted per-shard
loss aggregation across ranks" with torch.distributed.nn.functional.all_gather and good-token counts), then
`engine.backward(loss)` and `engine.step()`: one step.

The model is a tiny LlamaForCausalLM built from a LlamaConfig (no weights are downloaded; `torch.manual_seed(--seed)`
before construction, fp32, attn_implementation "sdpa"), the data a deterministic synthetic dataset (--seed).
Differences from the tutorial, all forced by CPU: gloo instead of nccl, a client torch.optim.SGD instead of the
config's Adam (FusedAdam needs compiled ops; `zero_allow_untested_optimizer`), fp32 instead of bf16. Any ZeRO
stage runs (the tutorial's is 3; its mpu has no get_data_parallel_group, so ZeRO-3 partitions over all ranks).

Data: every rank's DataLoader reads the dataset through a DistributedSampler over all dp x sp ranks (no
shuffle); UlyssesSPDataLoaderAdapter gathers one batch from each SP rank and returns, in turn, each of them
sharded on the sequence dimension. The first micro-batch of DP replica d is therefore the first batch of
global rank d*sp: rows {d*sp + k*world, k < --batch}. `--reference` runs world size 1 (no Ulysses, plain HF
forward with `labels=`: the model's own mean over the valid shifted tokens) on exactly those rows of the
sp x dp layout given by --sp/--dp, with the same ZeRO stage, captured the same way, so the parameter names match.
(With --dp > 1 and --ignore-frac > 0 the reference's mean pools the valid tokens of all rows, while DeepSpeed
averages the replicas' means: a separate, known difference; the dp > 1 cells here use --ignore-frac 0.)

--loss: `alst` = the tutorial's loss as written; `alst-div-sp` = that / sp; `token-weighted` = this rank's
mean x its good tokens / all good tokens of the sequence (counts summed with a plain all_reduce, no autograd
through the collective), i.e. per-rank losses that add up to the full-sequence mean over the SP group.
"""

import argparse
import json
import os
import sys
import time

from gradtrace import loss_recipes
import loop  # the launcher, ds_config, the CPU comm-op patch (loop.py beside this file)

# The --loss spellings this loop implements -> what gradtrace's RunInfo calls them (the one list of
# recipes and aliases, semantics/loss_recipes.cc; gradtrace-diff explains factors from it).
LOSS_NAMES = {name: loss_recipes.resolve(name) for name in ("alst", "alst-div-sp", "token-weighted")}


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=2)
    ap.add_argument("--no-reduce-scatter", action="store_true",
                    help="ZeRO reduce_scatter false (ZeRO-3: the all-reduce path for buckets up to "
                         "--reduce-bucket-size elements)")
    ap.add_argument("--loss", choices=sorted(LOSS_NAMES), default="alst")
    ap.add_argument("--reference", action="store_true",
                    help="world size 1, plain HF loss, on the global batch of the --sp x --dp run's first step")
    ap.add_argument("--ignore-frac", type=float, default=0.0, help="fraction of label positions set to -100")
    ap.add_argument("--out", required=True, help="trace directory (rank-NNNNN.gtrace)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1, help="micro-batch rows per DataLoader batch")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=4,
                    help="num_key_value_heads (Ulysses: a multiple or a divisor of sp)")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--reduce-bucket-size", type=int, default=2000, help="ZeRO reduce_bucket_size in elements")
    ap.add_argument("--capture", default="full", help="full, sketch:K or stats")
    ap.add_argument("--timeout", type=float, default=300, help="launcher: seconds before the job is killed")
    args = ap.parse_args(argv)
    args.gas, args.no_contiguous_gradients = 1, False  # what loop.ds_config reads besides batch and zero_stage
    if args.seq_len % args.sp:
        ap.error("--seq-len must divide by --sp")
    return args


def build_model(args):
    """A LlamaForCausalLM from a config, weights from --seed only (fp32)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM
    cfg = LlamaConfig(vocab_size=args.vocab, hidden_size=args.hidden, intermediate_size=2 * args.hidden,
                      num_hidden_layers=args.layers, num_attention_heads=args.heads, num_key_value_heads=args.kv_heads,
                      max_position_embeddings=max(64, args.seq_len), tie_word_embeddings=False, use_cache=False)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(args.seed)
    return LlamaForCausalLM(cfg).float().train()


def make_dataset(args, rows):
    """input_ids uniform over the vocabulary; labels = input_ids with --ignore-frac of positions -100 (the model or
    the Ulysses adapter shifts them); position_ids 0..seq_len-1 (UlyssesSPDataLoaderAdapter requires them)."""
    import torch
    g = torch.Generator().manual_seed(args.seed + 1)
    ids = torch.randint(0, args.vocab, (rows, args.seq_len), generator=g)
    labels = ids.clone()
    if args.ignore_frac > 0:
        labels[torch.rand((rows, args.seq_len), generator=g) < args.ignore_frac] = -100
    pos = torch.arange(args.seq_len).unsqueeze(0).expand(rows, -1).contiguous()
    return torch.utils.data.TensorDataset(ids, labels, pos)


def collate(rows):
    import torch
    ids, labels, pos = (torch.stack(t) for t in zip(*rows))
    return dict(input_ids=ids, labels=labels, position_ids=pos)


def alst_loss(engine, outputs, batch, sp_group, sp_world_size, variant):
    """The tutorial's loss code, as written in DeepSpeed's docs/_tutorials/ulysses-alst-sequence-parallelism.md
    (deepspeedai/DeepSpeed 292ccd6, "Part 1" training loop and "Loss averaging"; the same code is in
    tests/unit/ulysses_alst/test_ulysses_sp_hf.py):

        # as of this writing HF doesn't calculate loss with shift_labels yet and requires us to do it manually
        shift_labels = batch["shift_labels"]
        loss = model.module.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                          vocab_size=model.module.config.vocab_size)
        # differentiable weighted per-shard-loss aggregation across ranks
        losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
        # special dealing with SFT that has prompt tokens that aren't used in loss computation
        good_tokens = (shift_labels != -100).view(-1).sum()
        good_tokens_per_rank = torch.distributed.nn.functional.all_gather(good_tokens, group=sp_group)
        total_loss = sum(losses_per_rank[rank] * good_tokens_per_rank[rank] for rank in range(sp_world_size))
        total_good_tokens = sum(good_tokens_per_rank)
        loss = total_loss / max(total_good_tokens, 1)

    Returns (loss for backward, this rank's good tokens)."""
    import torch
    import torch.distributed.nn
    model = engine
    shift_labels = batch["shift_labels"]
    loss = model.module.loss_function(logits=outputs.logits, labels=None, shift_labels=shift_labels,
                                      vocab_size=model.module.config.vocab_size)
    good_tokens = (shift_labels != -100).view(-1).sum()
    if variant == "token-weighted":  # verification variant: no autograd through a collective
        total = good_tokens.clone()
        torch.distributed.all_reduce(total, group=sp_group)
        return loss * good_tokens / max(total, 1), good_tokens
    losses_per_rank = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
    good_tokens_per_rank = torch.distributed.nn.functional.all_gather(good_tokens, group=sp_group)
    total_loss = sum(losses_per_rank[rank] * good_tokens_per_rank[rank] for rank in range(sp_world_size))
    total_good_tokens = sum(good_tokens_per_rank)
    loss = total_loss / max(total_good_tokens, 1)
    if variant == "alst-div-sp":  # verification variant
        loss = loss / sp_world_size
    return loss, good_tokens


def gloo_subgroup_all_gather_backward():
    """torch 2.15 torch/distributed/nn/functional.py:418-422: for backends other than NCCL/XCCL the backward of
    torch.distributed.nn.functional.all_gather emulates reduce-scatter with _AlltoAll, whose gloo path
    (functional.py:466-471) calls `dist.scatter(out, to_send, i, group=group)` with the *group* rank i as the global
    `src`. On an SP group that does not contain global rank 0..sp-1 (every DP replica but the first, --dp > 1) it
    raises "Global rank 0 is not part of group". Replace that backward (gloo only) by the same reduce-scatter
    (sum): an all_reduce of the stacked gradients over the group, then this rank's slice. Same math; runtime patch,
    applied only when --dp > 1, so the sp-only runs use torch's own code."""
    import torch
    import torch.distributed as tdist
    from torch.distributed.nn import functional as tdnf
    original = tdnf._AllGather.backward

    def backward(ctx, *grad_outputs):
        if tdist.get_backend(group=ctx.group) in (tdist.Backend.NCCL, tdist.Backend.XCCL):
            return original(ctx, *grad_outputs)
        g = torch.stack([t.contiguous() for t in grad_outputs])
        tdist.all_reduce(g, group=ctx.group)
        return (None, g[tdist.get_rank(group=ctx.group)].clone())

    tdnf._AllGather.backward = staticmethod(backward)


def register_ulysses(args, model):
    """The Ulysses injection into HF Transformers (the tutorial's call; the model object instead of a hub
    name): the mpu."""
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPAttentionHF
    return UlyssesSPAttentionHF.register_with_transformers(
        model_name_or_path=model,
        core_attn_implementation="sdpa",
        sequence_parallel_size=args.sp,
        micro_batch_size=args.batch,
        seq_length=args.seq_len,
        seq_length_is_variable=True,
    )


def attach_capture(args, engine, mpu, fingerprint):
    """gradtrace.attach on the engine, with the run's settings in Config and RunInfo.extra."""
    import transformers
    import gradtrace
    recipe = "local-mean" if args.reference else LOSS_NAMES[args.loss]
    return gradtrace.attach(
        engine, args.out, mode=args.capture, mpu=mpu, loss=recipe,
        config={"seed": args.seed, "seq_len": args.seq_len, "batch": args.batch * (args.dp if args.reference else 1),
                "layers": args.layers, "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab,
                "ignore_frac": args.ignore_frac, "optimizer": "sgd", "lr": args.lr, "steps": 1},
        extra={"runner": "tools/repro/ds5248/alst.py", "argv": json.dumps(sys.argv[1:]),
               "transformers_version": transformers.__version__, "weights_fingerprint": repr(fingerprint),
               "loss_code": "reference: HF LlamaForCausalLM(labels=...).loss" if args.reference else
               f"ALST tutorial ({args.loss})"})


def reference_loss(args, engine, ds, run_world):
    """World 1: the plain HF loss over the rows the sp x dp run's first step takes; (loss, good tokens)."""
    import torch
    from deepspeed.runtime.utils import move_to_device
    rows = [d * args.sp + k * run_world for d in range(args.dp) for k in range(args.batch)]
    batch = move_to_device(collate([ds[i] for i in rows]), engine.device)
    loss = engine(**batch).loss
    return loss, (torch.nn.functional.pad(batch["labels"], (0, 1), value=-100)[..., 1:] != -100).sum()


def ulysses_loss(args, engine, ds):
    """This rank's shard of the first batch through UlyssesSPDataLoaderAdapter (the tutorial's, with a
    DistributedSampler over all ranks), and the tutorial's loss on it; (loss, good tokens)."""
    import torch
    import torch.distributed as tdist
    from deepspeed.runtime.sequence_parallel.ulysses_sp import UlyssesSPDataLoaderAdapter
    from deepspeed.runtime.utils import move_to_device
    from deepspeed.utils import groups
    sp_group = groups._get_sequence_parallel_group()
    sp_world_size = groups._get_sequence_parallel_world_size()
    sp_rank = groups._get_sequence_parallel_rank()
    sampler = torch.utils.data.DistributedSampler(ds, num_replicas=tdist.get_world_size(), rank=tdist.get_rank(),
                                                  shuffle=False)
    dl = torch.utils.data.DataLoader(ds, batch_size=args.batch, sampler=sampler, collate_fn=collate)
    dl = UlyssesSPDataLoaderAdapter(dl, sp_rank=sp_rank, sp_group=sp_group, sp_world_size=sp_world_size,
                                    device=engine.device)
    batch = move_to_device(next(iter(dl)), engine.device)
    # The adapter's shards are column slices (ulysses_sp.py:724); on a GPU move_to_device copies them, on CPU it
    # does not, and with --batch > 1 transformers' ForCausalLMLoss `shift_labels.view(-1)` then fails on the
    # non-contiguous slice. Copying changes no value.
    batch = {k: v.contiguous() if torch.is_tensor(v) else v for k, v in batch.items()}
    outputs = engine(**batch)
    return alst_loss(engine, outputs, batch, sp_group, sp_world_size, args.loss)


def worker(args):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as tdist
    import deepspeed
    import transformers

    torch.set_num_threads(1)
    loop.disable_shm_comm_op()
    deepspeed.init_distributed(dist_backend="gloo")
    if args.dp > 1 and not args.reference:
        gloo_subgroup_all_gather_backward()
    rank = tdist.get_rank()
    t0 = time.time()
    model = build_model(args)
    fingerprint = float(sum(p.detach().double().sum() for p in model.parameters()))
    run_world = args.sp * args.dp  # the layout whose data this job uses (the reference too)
    ds = make_dataset(args, rows=max(16, 2 * run_world * args.batch))
    mpu = None if args.reference else register_ulysses(args, model)
    cfg = loop.ds_config(args)
    if args.reference:
        cfg["train_micro_batch_size_per_gpu"] = args.batch * args.dp
    else:
        cfg["sequence_parallel_size"] = args.sp
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=cfg, mpu=mpu)
    cap = attach_capture(args, engine, mpu, fingerprint)
    loss, good_tokens = reference_loss(args, engine, ds, run_world) if args.reference else \
        ulysses_loss(args, engine, ds)
    engine.backward(loss)
    cap.record_step(loss, good_tokens)
    engine.step()
    cap.close()
    print(f"alst: rank {rank}: loss {float(loss.detach()):.7f} good_tokens {int(good_tokens)} "
          f"weights {fingerprint:.6f} ({time.time() - t0:.1f} s)", flush=True)
    tdist.barrier()
    if rank == 0:
        what = "reference (world 1, HF loss)" if args.reference else f"ALST loss={args.loss}"
        print(f"alst: wrote {args.out} (deepspeed {deepspeed.__version__}, transformers {transformers.__version__}, "
              f"sp={1 if args.reference else args.sp} dp={1 if args.reference else args.dp} zero={args.zero_stage} "
              f"{what}; recorded {cap.recorded}; unrecordable {cap.unrecordable or 'none'})", flush=True)
    tdist.destroy_process_group()
    return 0


def launch(args, argv):
    """Ranks of this script (loop.launch): sp x dp, or 1 for --reference."""
    return loop.launch(args, argv, script=__file__, world=1 if args.reference else None)


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if "RANK" not in os.environ:
        return launch(args, argv)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
