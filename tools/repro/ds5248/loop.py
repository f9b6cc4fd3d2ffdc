#!/usr/bin/env python3
"""DeepSpeed #5248 on CPU: the issue's Ulysses training loop with real DeepSpeed, captured by
gradtrace.attach(engine, ...) (the models: model.py; the mpu: mpu.py).

    python tools/repro/ds5248/run.py --sp 2 --zero-stage 2 --loss loss --out traces/sp2-z2-loss
    python tools/repro/ds5248/run.py --sp 1 --dp 1 --batch 1 --out traces/ref   # the reference
    (run.py runs this main(); gradtrace-versions --package deepspeed runs run.py for --model ds5248 and
    --model moe: DeepSpeed's description, python/gradtrace/versions/packages/deepspeed.json)

Without RANK in the environment it launches sp x dp worker processes of itself (gloo on 127.0.0.1,
a free port); under torchrun it is one worker. Weights and data depend on --seed only, and the
global batch of a step is --batch x dp rows (dp rank d takes rows [d*batch, (d+1)*batch)), so the
reference for an sp x dp run is `--sp 1 --dp 1 --batch <batch x dp>`.

The loop, per micro-step, as the issue's reporter wrote it:
    input_ids, labels, position_ids: this rank's contiguous chunk of the sequence
    loss = model_engine(input_ids=..., labels=..., position_ids=...)
    model_engine.backward(loss)            # --loss loss
    model_engine.backward(loss / sp)       # --loss loss-div-sp
    model_engine.step()
"""

import argparse
import json
import os
import sys

from gradtrace.versions import launch as launch_mod
from gradtrace.versions.packages.deepspeed_hooks import disable_shm_comm_op


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sp", type=int, default=2)
    ap.add_argument("--dp", type=int, default=1)
    ap.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=2)
    ap.add_argument("--loss", choices=["loss", "loss-div-sp", "token-weighted", "global-token-weighted", "full-sequence"],
                    default="loss")
    ap.add_argument("--ignore-frac", type=float, default=0.0, help="fraction of label positions set to -100")
    ap.add_argument("--steps", type=int, default=1)
    ap.add_argument("--gas", type=int, default=1)
    ap.add_argument("--out", required=True, help="trace directory (rank-NNNNN.gtrace)")
    ap.add_argument("--seed", type=int, default=1234)
    ap.add_argument("--seq-len", type=int, default=32)
    ap.add_argument("--batch", type=int, default=1, help="micro-batch rows per DP rank")
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--vocab", type=int, default=64)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--reduce-bucket-size", type=int, default=2000,
                    help="ZeRO reduce_bucket_size in elements (small: several buckets, params split "
                         "across partitions)")
    ap.add_argument("--no-contiguous-gradients", action="store_true",
                    help="ZeRO contiguous_gradients false (ZeRO-1/2: reduces nothing on CPU in some versions)")
    ap.add_argument("--no-reduce-scatter", action="store_true",
                    help="ZeRO reduce_scatter false (ZeRO-3: the all-reduce path, stage3.py "
                         "__avg_scatter_contiguous_grads, when contiguous_gradients is true)")
    ap.add_argument("--zero3-partition", choices=["sdp", "initialize"], default="sdp",
                    help="ZeRO-3: sdp = partition the parameters over the sequence-data-parallel group with "
                         "deepspeed.zero.Init(module=..., data_parallel_group=sdp), as Megatron-DeepSpeed does; "
                         "initialize = leave it to deepspeed.initialize, which partitions (and so reduces) over "
                         "mpu.get_data_parallel_group(), leaving the SP ranks out")
    ap.add_argument("--moe-experts", type=int, default=0,
                    help="replace every MLP by deepspeed.moe.layer.MoE with this many experts (0: dense)")
    ap.add_argument("--model", choices=["tiny", "gradtrace"], default="tiny",
                    help="tiny: model.py's TinyLM, weights and data from --seed; gradtrace: gradtrace-train's "
                         "model (capture/train/model.cc), weights and global batches from --init")
    ap.add_argument("--init", help="--model gradtrace: the file of `gradtrace-train --export-init FILE` (same "
                                   "--seed --seq-len --vocab --hidden --heads --layers --steps --gas, and "
                                   "gradtrace-train --batch = this --batch x --dp)")
    ap.add_argument("--ds-config", help="a DeepSpeed config (JSON file) laid over the one built from these "
                                       "options: its zero_optimization, train_micro_batch_size_per_gpu and "
                                       "gradient_accumulation_steps win over --zero-stage, --batch and --gas")
    ap.add_argument("--capture", default="full", help="full, sketch:K or stats")
    ap.add_argument("--timeout", type=float, default=300, help="launcher: seconds before the job is killed")
    args = ap.parse_args(argv)
    if args.model == "gradtrace" and (not args.init or args.moe_experts):
        ap.error("--model gradtrace needs --init FILE and is dense only (no --moe-experts)")
    if args.model == "tiny" and args.init:
        ap.error("--init is for --model gradtrace")
    if args.ds_config:
        apply_user_config(args, ap.error)
    return args


def merge_config(base, over):
    """`over` laid over `base`, nested dicts merged key by key."""
    out = dict(base)
    for k, v in over.items():
        out[k] = merge_config(base[k], v) if isinstance(v, dict) and isinstance(base.get(k), dict) else v
    return out


def apply_user_config(args, error):
    """Read --ds-config; the loop's batch, gas and stage follow it (a bad file: one line, exit 2)."""
    try:
        with open(args.ds_config) as f:
            args.user_config = json.load(f)
    except (OSError, ValueError) as e:
        error(f"{args.ds_config}: not a readable JSON DeepSpeed config ({e})")
    cfg = args.user_config
    if not isinstance(cfg, dict) or not isinstance(cfg.get("zero_optimization", {}), dict):
        error(f"{args.ds_config}: a DeepSpeed config is a JSON object with an object zero_optimization")
    zero = cfg.get("zero_optimization", {})
    args.zero_stage = int(zero.get("stage", 0))
    args.batch = int(cfg.get("train_micro_batch_size_per_gpu", args.batch))
    args.gas = int(cfg.get("gradient_accumulation_steps", args.gas))
    args.reduce_bucket_size = int(zero.get("reduce_bucket_size", args.reduce_bucket_size))
    args.no_contiguous_gradients = not zero.get("contiguous_gradients", not args.no_contiguous_gradients)
    args.no_reduce_scatter = not zero.get("reduce_scatter", not args.no_reduce_scatter)


def launch(args, argv, script=None, world=None, python=None, extra_env=None, log=None):
    """Start `world` (default sp x dp) copies of `script` (default this file) with `python` (default this
    interpreter) as ranks on 127.0.0.1 (gradtrace.versions.launch), DeepSpeed's CPU variables set; the worst
    exit status (124 after args.timeout s)."""
    world = args.sp * args.dp if world is None else world
    env = dict(extra_env or {}, DS_ACCELERATOR="cpu",
               # As DeepSpeed's launcher: the CPU accelerator's device_count() before 0.14 reads it, else
               # runs numactl (deepspeed/utils/numa.py), which ZeRO-3 reaches during the reduction.
               LOCAL_SIZE=str(world))
    return launch_mod.launch([os.path.abspath(script or __file__)], argv, world, args.timeout, python=python,
                             extra_env=env, log=log, name="ds5248")


def ds_config(args):
    cfg = {
        "train_micro_batch_size_per_gpu": args.batch,
        "gradient_accumulation_steps": args.gas,
        "steps_per_print": 1 << 30,
        "wall_clock_breakdown": False,
        "zero_allow_untested_optimizer": True,  # torch.optim.SGD under ZeRO
        "zero_optimization": {"stage": args.zero_stage},
    }
    if args.zero_stage > 0:
        cfg["zero_optimization"].update({
            "contiguous_gradients": not args.no_contiguous_gradients,
            "overlap_comm": False,
            "reduce_scatter": not args.no_reduce_scatter,
            "reduce_bucket_size": args.reduce_bucket_size,
            "allgather_bucket_size": args.reduce_bucket_size,
        })
    user = getattr(args, "user_config", None)
    return merge_config(cfg, user) if user else cfg


def gloo_for_stubbed_oneccl():
    """DeepSpeed < 0.14 CPU accelerator: imports oneccl_bindings_for_pytorch unconditionally and names
    'ccl' as its communication backend; deepspeed.init_distributed then builds the CCL comm op (needs
    oneCCL's CCL_ROOT). In the old-release environments (gradtrace-versions, DeepSpeed's pinned base) that
    import is satisfied by an empty stub; there, name gloo instead, as 0.14+ does when oneCCL is absent. Runtime only."""
    stub = sys.modules.get("oneccl_bindings_for_pytorch")
    if not getattr(stub, "__gradtrace_stub__", False):
        return
    from deepspeed.accelerator import get_accelerator
    acc = get_accelerator()
    if getattr(acc, "_communication_backend_name", None) == "ccl":
        acc._communication_backend_name = "gloo"


def gloo_all_gather_fallback():
    """torch < 2.2's gloo has no _allgather_base (all_gather_into_tensor): ZeRO-1/2's parameter all-gather
    after the optimizer step (runtime/utils.py all_gather_dp_groups) then fails. DeepSpeed has its own
    fallback to list all_gather when its backend reports no all_gather_into_tensor; make it report that
    when a probe shows gloo cannot do it. That covers the post-step parameter all-gather (after FINAL is
    captured); the direct callers of all_gather_into_tensor (ZeRO-3's FINAL read-out from 0.13.0 on) get the
    list form below. Gradient reduction does not use this collective. Runtime only."""
    import torch
    import torch.distributed as tdist
    try:
        t = torch.zeros(1)
        tdist.all_gather_into_tensor(torch.zeros(tdist.get_world_size()), t)
        return False
    except RuntimeError:
        from deepspeed.comm import comm as ds_comm
        cdb = ds_comm.cdb
        cdb.has_all_gather_into_tensor = lambda: False

        # With that, cdb.all_gather_into_tensor does nothing at all (comm/torch.py:206-211 at 0.13.0, read),
        # and ZeRO-3's _fp32_state_allgather (stage3.py:2186 at 0.13.0, read), under safe_get_full_grad,
        # calls it directly: FINAL would hold only this rank's partition (measured: ranks' FINAL disagree,
        # relative spread 4.5e2). Render it as the list all_gather into the output's world chunks (the
        # same gathered bytes, as 0.11.x's _fp32_state_allgather does itself).
        cdb.all_gather_into_tensor = all_gather_into_tensor_via_list
        return True


def all_gather_into_tensor_via_list(output_tensor, input_tensor, group=None, async_op=False):
    """all_gather_into_tensor through gloo's list all_gather: rank i's input lands in the output's chunk i."""
    import torch.distributed as tdist
    chunks = list(output_tensor.reshape(-1).chunk(tdist.get_world_size(group)))
    tdist.all_gather(chunks, input_tensor.contiguous().reshape(-1), group=group)
    return None  # done synchronously


def gloo_list_all_to_all():
    """gloo has all_to_all_single but not the list form all_to_all, which DistributedAttention before
    0.12 uses (deepspeed/sequence/layer.py: dist.all_to_all(output_list, input_list, group)). If a probe
    shows the list form is missing, route deepspeed.comm.all_to_all through all_to_all_single: the same
    exchange (chunk i of the input to rank i, chunk j of the output from rank j), no change to the math of
    attention or to the gradient reduction. Runtime only."""
    import torch
    import torch.distributed as tdist
    world = tdist.get_world_size()
    try:
        tdist.all_to_all([torch.zeros(1) for _ in range(world)], [torch.zeros(1) for _ in range(world)])
        return False
    except RuntimeError:
        pass
    import deepspeed.comm as ds_comm

    def all_to_all(output_tensor_list, input_tensor_list, group=None, async_op=False):
        inp = torch.cat([t.contiguous().reshape(-1) for t in input_tensor_list])
        out = torch.empty(sum(t.numel() for t in output_tensor_list), dtype=inp.dtype, device=inp.device)
        tdist.all_to_all_single(out, inp, output_split_sizes=[t.numel() for t in output_tensor_list],
                                input_split_sizes=[t.numel() for t in input_tensor_list], group=group)
        off = 0
        for t in output_tensor_list:
            t.copy_(out[off:off + t.numel()].view_as(t))
            off += t.numel()
        return None

    ds_comm.all_to_all = all_to_all
    return True


def gloo_reduce_scatter_via_all_reduce():
    """torch < 2.2's gloo has no reduce-scatter (neither reduce_scatter_tensor/_reduce_scatter_base nor the
    list reduce_scatter): ZeRO-3 stops in its gradient reduction. Both forms reach DeepSpeed's backend object
    (deepspeed.comm.comm.reduce_scatter_fn -> reduce_scatter_tensor -> cdb.reduce_scatter_tensor, or the list
    fallback -> cdb.reduce_scatter; 0.11.1-0.14.5 comm/comm.py:246-289, 446-455, read), which stage 3 reaches
    through runtime/comm/coalesced_collectives.py reduce_scatter_coalesced (0.11.1 :120, 0.14.x :128, read).
    If a probe shows gloo refuses it, render it there as all_reduce with the same op over the whole input
    followed by taking this rank's chunk: every rank gets the same elementwise sum of the same world inputs
    that reduce-scatter would deliver (its chunk of it), so the reduction's divisor and result are unchanged
    (checked by the dp=2 sp=1 sanity cell: FINAL equals the single-rank reference). Runtime only."""
    import torch
    import torch.distributed as tdist
    world = tdist.get_world_size()
    try:
        tdist.reduce_scatter_tensor(torch.zeros(1), torch.zeros(world))
        return False
    except (RuntimeError, AttributeError):
        pass
    from deepspeed.comm import comm as ds_comm
    cdb = ds_comm.cdb
    to_torch_op = getattr(cdb, "_reduce_op", lambda op: op)  # DeepSpeed's ReduceOp -> torch's

    def reduce_scatter_tensor(output_tensor, input_tensor, op=tdist.ReduceOp.SUM, group=None, async_op=False):
        return reduce_scatter_tensor_via_all_reduce(output_tensor, input_tensor, to_torch_op(op), group)

    def reduce_scatter(output, input_list, op=tdist.ReduceOp.SUM, group=None, async_op=False):
        return reduce_scatter_list_via_all_reduce(output, input_list, to_torch_op(op), group)

    cdb.reduce_scatter_tensor = reduce_scatter_tensor
    cdb.reduce_scatter = reduce_scatter
    return True


def reduce_scatter_tensor_via_all_reduce(output_tensor, input_tensor, op=None, group=None):
    """reduce_scatter_tensor through gloo: all_reduce a copy of the whole input with `op` (default SUM), keep
    this rank's chunk. Done synchronously (stage 3 calls it with async_op=False)."""
    import torch.distributed as tdist
    full = input_tensor.contiguous().clone()
    tdist.all_reduce(full, op=tdist.ReduceOp.SUM if op is None else op, group=group)
    n, r = output_tensor.numel(), tdist.get_rank(group=group)
    output_tensor.copy_(full.reshape(-1)[r * n:(r + 1) * n].view_as(output_tensor))
    return None


def reduce_scatter_list_via_all_reduce(output, input_list, op=None, group=None):
    """The list form of reduce_scatter through gloo: input_list[i] is rank i's chunk."""
    import torch
    return reduce_scatter_tensor_via_all_reduce(output, torch.cat([t.reshape(-1) for t in input_list]), op, group)


def init_distributed_on_cpu():
    """deepspeed.init_distributed on gloo, with the runtime patches old releases and torch's gloo need."""
    import deepspeed

    disable_shm_comm_op()
    gloo_for_stubbed_oneccl()
    deepspeed.init_distributed(dist_backend="gloo")  # the CPU accelerator's default is ccl only with oneCCL
    gloo_all_gather_fallback()
    gloo_list_all_to_all()
    gloo_reduce_scatter_via_all_reduce()


def build_loop_model(args, mpu, recipe):
    """(model, gradtrace-train's init or None): the --model to train, its loss recipe and groups set."""
    from model import build_gradtrace_model, build_model, load_gradtrace_init

    sp_group = mpu.get_sequence_parallel_group() if args.sp > 1 else None
    init = None
    if args.model == "gradtrace":
        init = load_gradtrace_init(args.init)
        model = build_gradtrace_model(init, args.vocab, args.hidden, args.heads, args.layers, args.seq_len, sp_group)
    else:
        model = build_model(args.seed, args.vocab, args.hidden, args.heads, args.layers, args.seq_len, sp_group,
                            args.moe_experts)
    model.recipe = "local-mean" if recipe == "local-mean-div-sp" else recipe
    if args.sp * args.dp > 1:
        model.sdp_group, model.dp = mpu.get_sequence_data_parallel_group(), args.dp
    return model, init


def initialize_engine(args, model, mpu):
    """deepspeed.initialize with SGD over the model (expert parameters in their own groups); ZeRO-3 partitions
    over the sequence-data-parallel group first (--zero3-partition sdp)."""
    import torch
    import deepspeed

    params = model.parameters()
    if args.moe_experts:
        # ZeRO needs the expert parameters in their own optimizer groups (deepspeed.moe.utils).
        from deepspeed.moe.utils import split_params_into_different_moe_groups_for_optimizer
        params = split_params_into_different_moe_groups_for_optimizer({"params": list(model.parameters()),
                                                                       "name": "params"})
    if args.zero_stage == 3 and args.zero3_partition == "sdp":
        # deepspeed.initialize would convert the parameters itself, partitioned over the mpu's pure DP group
        # (runtime/zero/parameter_offload.py:267); stage 3 reduces each gradient over its parameter's
        # partition group, so partition over sdp first (the model is already built: module=).
        deepspeed.zero.Init(module=model, data_parallel_group=mpu.get_sequence_data_parallel_group(),
                            config_dict_or_path=ds_config(args))
    optimizer = torch.optim.SGD(params, lr=args.lr)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_config(args), mpu=mpu)
    return engine


def global_batch(args, init, step, micro):
    """(input_ids, labels, position_ids) of micro-step `micro` of `step`: all batch x dp rows, whole sequence;
    gradtrace-train's with --init (its --ignore-frac applies, not ours), else drawn from --seed."""
    import torch
    from model import make_batch

    if init is not None:
        key = f"batch/{step}/{micro}/"
        if key + "input_ids" not in init:
            raise SystemExit(f"ds5248: --init has no {key}*: export with --steps {args.steps} --gas {args.gas}")
        ids, labels, pos = (init[key + k] for k in ("input_ids", "labels", "position_ids"))
        if tuple(ids.shape) != (args.batch * args.dp, args.seq_len):
            raise SystemExit(f"ds5248: --init batch is {tuple(ids.shape)}, expected "
                             f"({args.batch * args.dp}, {args.seq_len}): export with "
                             f"--batch {args.batch * args.dp} --seq-len {args.seq_len}")
        return ids, labels, pos
    ids, labels = make_batch(args.seed, step * args.gas + micro, args.batch * args.dp, args.seq_len,
                             args.vocab, args.ignore_frac)
    return ids, labels, torch.arange(args.seq_len).unsqueeze(0).expand(args.batch * args.dp, -1)


def train(args, engine, cap, mpu, recipe, init):
    """The issue's loop: each rank takes its dp rows and its contiguous sp chunk of the sequence."""
    sp, sp_rank, dp_rank = args.sp, mpu.get_sequence_parallel_rank(), mpu.get_data_parallel_rank()
    assert args.seq_len % sp == 0, "seq_len must divide by sp"
    sub = args.seq_len // sp
    lo, hi = sp_rank * sub, (sp_rank + 1) * sub
    rows = slice(dp_rank * args.batch, (dp_rank + 1) * args.batch)
    for step in range(args.steps):
        for micro in range(args.gas):
            ids, labels, pos = global_batch(args, init, step, micro)
            lab = labels[rows, lo:hi]
            loss = engine(input_ids=ids[rows, lo:hi], labels=lab, position_ids=pos[rows, lo:hi])
            if recipe == "local-mean-div-sp":
                loss = loss / sp
            engine.backward(loss)
            cap.record_step(loss, (lab != -100).sum())
            engine.step()


def worker(args):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import torch
    import torch.distributed as tdist
    import deepspeed
    import gradtrace
    from gradtrace.adapters import deepspeed_adapter
    from mpu import UlyssesMPU

    torch.set_num_threads(1)
    init_distributed_on_cpu()
    mpu = UlyssesMPU(args.sp, args.dp)
    recipe = deepspeed_adapter.LOSS_RECIPES[args.loss]
    model, init = build_loop_model(args, mpu, recipe)
    engine = initialize_engine(args, model, mpu)
    cap = gradtrace.attach(
        engine, args.out, mode=args.capture, mpu=mpu, loss=recipe,
        config={"seed": args.seed, "seq_len": args.seq_len, "batch": args.batch, "layers": args.layers,
                "hidden": args.hidden, "heads": args.heads, "vocab": args.vocab, "ignore_frac": args.ignore_frac,
                "optimizer": "sgd", "lr": args.lr, "steps": args.steps, "moe_experts": args.moe_experts},
        extra={"runner": "tools/repro/ds5248/loop.py", "argv": json.dumps(sys.argv[1:]),
               "model": args.model})
    train(args, engine, cap, mpu, recipe, init)
    cap.close()
    if tdist.get_rank() == 0:
        print(f"ds5248: wrote {args.out} (deepspeed {deepspeed.__version__}, sp={args.sp} dp={args.dp} "
              f"zero={args.zero_stage} loss={args.loss}; recorded {cap.recorded}; "
              f"unrecordable {cap.unrecordable or 'none'}"
              + (f"; stage-3 paths {cap.zero3_paths}" if hasattr(cap, "zero3_paths") else "") + ")", flush=True)
    tdist.barrier()
    tdist.destroy_process_group()
    return 0


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    if "RANK" not in os.environ:
        return launch(args, argv)
    return worker(args)


if __name__ == "__main__":
    sys.exit(main())
