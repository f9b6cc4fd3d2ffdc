"""The zoo's pairs: which trace sets make each reproduced row of ../../shared/bug-zoo.md (the
project's list; rows by number, distractors D1-D3), how each was made, and the factor each
parameter group of the buggy run must measure against the reference (None: not a scalar).

The dense model's parameters are all in group "all"; the MoE model's split into "experts" and
"dense" (router, embedding, norm, head)."""

from dataclasses import dataclass, field

PLAIN = "plain-PyTorch rendering (gloo, manual adapter)"
EMULATION = "gradtrace-train emulation of DeepSpeed"


@dataclass(frozen=True)
class Case:
    row: str  # bug-zoo.md row, or D1-D3 for the logging-only distractors
    report: str
    how: str
    reference: str  # trace set both runs are diffed against
    bug: str
    ok: str | None  # the corrected run (None: the distractor's gradients are right already)
    factors: dict = field(default_factory=dict)  # param group -> B/A of the buggy run; None: not a scalar
    norm_off: float | None = None  # distractors: reported / computed grad norm of the buggy run
    slow: bool = False  # real DeepSpeed ZeRO-3: minutes; run by `run_all.py --slow`, not in CI


CASES = [
    Case("1", "DeepSpeed issue #5248", f"{EMULATION} 0.19.8, ZeRO-2, sp 2: loss vs loss / sp", "train-ref",
         "train-5248-bug", "train-5248-ok", {"all": 2.0}),
    Case("2", "DeepSpeed PR #4530", f"{EMULATION} 0.11.1 vs 0.11.2, ZeRO-2, sp 2, loss / sp", "train-ref",
         "train-4530-bug", "train-4530-ok", {"all": 0.5}),
    Case("3", "DeepSpeed PR #5555", f"{EMULATION} 0.14.0 vs 0.14.4, ZeRO-0, sp 4, loss / sp", "train-ref",
         "train-5555-bug", "train-5555-ok", {"all": 0.25}),
    Case("4", "DeepSpeed PR #5259", f"{PLAIN}: dp 4 x ep 2, expert grads all-reduced over edp / edp", "ref-moe",
         "ds-5259-bug", "ep-ok", {"experts": 2.0, "dense": 1.0}),
    Case("5", "DeepSpeed issue #6545 / PR #6546", f"{PLAIN}: dp 4 x ep 2, expert bucket reduce-scattered over "
         "edp / edp (ZeRO-2 partitions)", "ref-moe", "ds-6545-bug", "ds-6545-ok", {"experts": 2.0, "dense": 1.0}),
    Case("6", "PyTorch issue #160285", f"{PLAIN}: dp 4 x ep 2, every gradient / (dp / ep)", "ref-moe",
         "titan-160285-bug", "ep-ok", {"experts": 2.0, "dense": 2.0}),
    Case("8", "Megatron-LM PR #7160", f"{PLAIN}: tp 2 x dp 2, expert grads summed over dp x tp / dp", "ref-moe",
         "megatron-7160-bug", "megatron-7160-ok", {"experts": 2.0, "dense": 1.0}),
    Case("9", "Megatron-LM issue #673", f"{PLAIN}: dp 2 x cp 2, local-mean loss x cp, grads averaged over dp x cp",
         "ref-dense", "megatron-673-bug", "megatron-673-ok", {"all": 2.0}),
    Case("10", "VeOmni PR #338", f"{PLAIN}: sp 4, loss x dp instead of x dp x sp", "ref-seq", "veomni-338-bug",
         "veomni-338-ok", {"all": 0.25}),
    Case("11", "VeOmni PR #1115 (issue #1059)", f"{PLAIN}: sp 2, dp 1, all-reduce over the dp group only",
         "ref-seq", "veomni-1115-bug", "veomni-1115-ok", {"all": None}),
    Case("12", "verl issues #2855/#2857", f"{PLAIN}: sp 2, gas 2, loss / micro-batch tokens / gas", "ref-seq",
         "verl-2855-bug", "verl-2855-ok", {"all": None}),
    Case("14", "hamishivi/tmax PR #9", "real DeepSpeed 0.19.8 ZeRO-3 (tools/repro/ds5248/run.py), sp 4: "
         "dp x CE sum / global tokens vs local mean", "ds-ref", "ds-tmax-bug", "ds-tmax-ok", {"all": 0.25}, slow=True),
    Case("15", "NVIDIA-NeMo Automodel PR #3830", f"{PLAIN}: 1 rank, gas 4 (splits [1,1,1,1]), sum of micro-batch "
         "means", "ref-dense", "nemo-3830-bug", "nemo-3830-ok", {"all": 4.0}),
    Case("16", "Hugging Face transformers PR #34191", f"{PLAIN}: dp 2, gas 2, mean per micro-batch / gas",
         "ref-seq", "hf-34191-bug", "hf-34191-ok", {"all": None}),
    Case("18", "PyTorch issue #155903", f"{PLAIN}: HSDP shard 2 x replicate 2, reduce-scatter / shard size "
         "then all-reduce (sum) over the replicas", "ref-dense", "hsdp-155903-bug", "hsdp-155903-ok", {"all": 2.0}),
    Case("D1", "ms-swift PR #8341", f"{PLAIN}: dp 2, logged norm of the rank's own shard", "ref-dense",
         "swift-8341-bug", None, {"all": 1.0}),  # norm_off: the test derives it from the shard's FINAL
    Case("D2", "MindSpore hyper-parallel issue #526", f"{PLAIN}: dp 2, replicated params counted once per rank",
         "ref-dense", "mindspore-526-bug", None, {"all": 1.0}, norm_off=2 ** 0.5),
    Case("D3", "DeepSpeed issue #7837", f"{PLAIN}: dp 2, norm of the summed gradients (before / dp)", "ref-dense",
         "ds-7837-bug", None, {"all": 1.0}, norm_off=2.0),
]

# gradtrace-train runs (name -> arguments); one small model for all, 1 step.
TRAIN_MODEL = ["--layers", "1", "--hidden", "16", "--heads", "4", "--vocab", "32", "--seq-len", "16", "--batch", "2",
               "--steps", "1"]
TRAIN_RUNS = {
    "train-ref": "--nproc 1 --dp 1 --sp 1 --zero-stage 2 --scaling mean --loss local-mean",
    "train-5248-bug": "--nproc 2 --dp 1 --sp 2 --zero-stage 2 --scaling deepspeed@0.19.8 --loss local-mean",
    "train-5248-ok": "--nproc 2 --dp 1 --sp 2 --zero-stage 2 --scaling deepspeed@0.19.8 --loss local-mean-div-sp",
    "train-4530-bug": "--nproc 2 --dp 1 --sp 2 --zero-stage 2 --scaling deepspeed@0.11.1 --loss local-mean-div-sp",
    "train-4530-ok": "--nproc 2 --dp 1 --sp 2 --zero-stage 2 --scaling deepspeed@0.11.2 --loss local-mean-div-sp",
    "train-5555-bug": "--nproc 4 --dp 1 --sp 4 --zero-stage 0 --scaling deepspeed@0.14.0 --loss local-mean-div-sp",
    "train-5555-ok": "--nproc 4 --dp 1 --sp 4 --zero-stage 0 --scaling deepspeed@0.14.4 --loss local-mean-div-sp",
}


def group_of(name: str, factors: dict) -> str:
    """The parameter group of ``name`` among a case's groups."""
    if "all" in factors:
        return "all"
    return "experts" if name.startswith("experts.") else "dense"

# Real DeepSpeed runs (tools/repro/ds5248/run.py arguments): the slow cases.
DS_RUNS = {
    "ds-ref": "--sp 1 --dp 1 --batch 1 --zero-stage 3 --loss loss",
    # tmax: the trainer scales the token-sum loss by dp only; ZeRO-3's reduce-scatter averages over dp x sp
    "ds-tmax-bug": "--sp 4 --zero-stage 3 --loss global-token-weighted",
    "ds-tmax-ok": "--sp 4 --zero-stage 3 --loss loss",
}
