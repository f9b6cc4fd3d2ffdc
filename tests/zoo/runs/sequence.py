"""Dense runs over data, sequence and context parallelism and gradient accumulation: the tiny
attention LM (tests/python/adapter_runs.py), each rank a block of rows (dp) and a contiguous part of
the sequence (sp/cp: attention all-gathers keys and values over the group, whose backward sums
their gradients over it), then a hand-written gradient reduction recorded by the manual adapter.
Ulysses' all-to-all is rendered as this all-gather: the gradients the ranks hold before the
reduction are the same (each rank's loss reaches every rank's keys and values).

Each report's framework (Megatron-LM, VeOmni, verl, NeMo, Hugging Face) does not run here; every
function below is a plain-PyTorch rendering of the report's loss and reduction arithmetic."""

import functools

import torch.distributed as dist

from zoo_model import BATCH, IGNORE, SEQ, GatherSeq, batch, capture, ce_sum, grad_norm, make_lm, reduce_grads

from . import Scenario


def train(ranks, out, *, dp=1, sp=1, dim="sp", gas=1, ignore=False, loss, reduce_over="world", divisor=None,
          recipe="", description="", report_norm=None):
    """One optimizer step of world = dp x sp ranks (rank = d * sp + s). ``loss(ce_sum, local, micro,
    total)`` makes the micro-step's loss from this rank's CE sum and token counts (this rank's in
    the micro-batch, the micro-batch's over all ranks, the step's over all ranks). Gradients are
    summed over ``reduce_over`` ("world", "dp" or "sp") and divided by ``divisor`` (default: dp).
    ``report_norm(params, groups, summed_norm)``: the grad norm the training logs (default: the
    norm of the final gradients; ``summed_norm`` is the norm before the division)."""
    world, rank = dp * sp, ranks.rank
    d, s = divmod(rank, sp)
    groups = {dim: [d * sp + i for i in range(sp)], "dp": [i * sp + s for i in range(dp)]}
    groups_pg = {name: ranks.group(r) for name, r in {**groups, "world": range(world)}.items()}
    net = make_lm()
    cap = capture(net, out, rank, world, degrees={"dp": dp, dim: sp}, groups=groups, default_group=reduce_over,
                  gas=gas, cp_kind="all-gather" if dim == "cp" and sp > 1 else "", loss=recipe,
                  loss_description=description)
    tokens, labels = batch(0, ignore)
    rows, cols = BATCH // dp, SEQ // sp
    tokens = tokens[d * rows:(d + 1) * rows, s * cols:(s + 1) * cols]
    labels = labels[d * rows:(d + 1) * rows, s * cols:(s + 1) * cols]
    total = _all_sum((labels != IGNORE).sum(), groups_pg["world"])
    gather = (lambda x: GatherSeq.apply(x, groups_pg[dim])) if sp > 1 else None
    for micro in range(gas):
        mb = slice(micro * rows // gas, (micro + 1) * rows // gas)
        t, y = tokens[mb], labels[mb]
        local = (y != IGNORE).sum()
        micro_total = _all_sum(local, groups_pg["world"])
        value = loss(ce_sum(net(t, gather=gather), y), local, micro_total, total)
        value.backward()
        cap.record_step(value, local)
    params = list(net.parameters())
    div = float(dp if divisor is None else divisor)
    with cap.around(reduce_over, params, divisor=div):
        reduce_grads(params, groups_pg[reduce_over], 1.0)
        summed = grad_norm(params)
        for p in params:
            p.grad.div_(div)
    cap.step(grad_norm(params) if report_norm is None else report_norm(params, groups_pg, summed))
    cap.close()


def _all_sum(x, group):
    x = x.clone()
    if group is not None:
        dist.all_reduce(x, group=group)
    return x


def reference(ranks, out, *, ignore):
    """One rank, the whole batch and sequence, the mean CE over every valid token."""
    train(ranks, out, ignore=ignore, loss=lambda ce, local, micro, total: ce / total, reduce_over="dp",
          recipe="global-token-weighted", description="mean CE over every token of the batch")


def megatron_673(ranks, out, *, bug):
    """Megatron-LM issue #673, context parallel: gradients are averaged over dp x cp; each cp rank's
    loss is its local token mean, and the bug multiplies it by cp as well. dp 2 x cp 2, equal token
    counts: correct = reference, bug = cp x."""
    cp = 2
    train(ranks, out, dp=2, sp=cp, dim="cp", loss=lambda ce, local, micro, total: ce / local * (cp if bug else 1),
          reduce_over="world", divisor=4, recipe="local-mean",
          description="local token mean" + (" x cp" if bug else "") + ", gradients averaged over dp x cp")


def veomni_338(ranks, out, *, bug):
    """VeOmni PR #338: CE sum / global valid tokens, scaled by the size of the group the gradients
    are averaged over; the bug scales by dp instead of dp x sp. dp 1 x sp 4, unequal shards:
    correct = reference, bug = 1/sp (the report: "8x smaller" at sp 8)."""
    scale = 1 if bug else 4
    # the bug's recipe is gradtrace's global-token-weighted (dp x CE sum / global tokens); the fix's has no name
    train(ranks, out, dp=1, sp=4, ignore=True, loss=lambda ce, local, micro, total: ce / total * scale,
          reduce_over="world", divisor=4, recipe="global-token-weighted" if bug else "",
          description=f"CE sum / global valid tokens x {'dp' if bug else 'dp x sp'}, gradients averaged over dp x sp")


def veomni_1115(ranks, out, *, bug):
    """VeOmni PR #1115 (issue #1059): the data-parallel group of the gradient all-reduce leaves out
    the Ulysses dimension; at dp = 1 it is a no-op and each SP rank keeps its own partial gradient.
    sp 2, token-weighted loss: correct (summed over dp x sp) = reference, bug: not a scalar multiple."""
    train(ranks, out, dp=1, sp=2, ignore=True, loss=lambda ce, local, micro, total: ce / total,
          reduce_over="dp" if bug else "world", divisor=1, recipe="global-token-weighted",
          description="CE sum / global valid tokens, gradients summed over " + ("dp only" if bug else "dp x sp"))


def verl_2855(ranks, out, *, bug):
    """verl issues #2855/#2857: Ulysses SP with gradient accumulation, token-level loss normalised
    per micro-batch and scaled by 1/micro-batches instead of by the step's valid tokens. sp 2, gas 2,
    unequal token counts per micro-batch: correct = reference, bug: not a scalar multiple."""
    def loss(ce, local, micro, total):
        return ce / micro / 2 if bug else ce / total

    train(ranks, out, dp=1, sp=2, gas=2, ignore=True, loss=loss, reduce_over="world", divisor=1,
          recipe="global-token-weighted",
          description="CE sum / " + ("micro-batch valid tokens / gas" if bug else "the step's valid tokens"))


def hf_34191(ranks, out, *, bug):
    """Hugging Face transformers PR #34191 (+ #35438, #37766): gradient accumulation with the loss
    normalised per micro-batch (mean over its valid tokens, / gas) instead of by the valid tokens of
    the whole accumulated batch. dp 2 (average), gas 2, unequal counts: correct = reference, bug:
    not a scalar multiple."""
    def loss(ce, local, micro, total):
        return ce / local / 2 if bug else ce / total * 2

    train(ranks, out, dp=2, gas=2, ignore=True, loss=loss, recipe="local-mean" if bug else "global-token-weighted",
          description="mean CE of the micro-batch / gas" if bug else "CE sum / num_items_in_batch x dp")


def nemo_3830(ranks, out, *, bug):
    """NVIDIA-NeMo Automodel PR #3830: sequence-classification loss as a mean of micro-batch means
    that is not divided by the number of micro-batches. One rank, gas 4 (the report's splits
    [1, 1, 1, 1] of 4 rows), equal counts: correct = reference, bug = gas x (the report: 4.00x)."""
    train(ranks, out, gas=4, loss=lambda ce, local, micro, total: ce / local / (1 if bug else 4),
          recipe="local-mean", description="mean CE of the micro-batch" + ("" if bug else " / gas"))


def _pair(name, fn, world):
    return [Scenario(f"{name}-bug", world, functools.partial(fn, bug=True)),
            Scenario(f"{name}-ok", world, functools.partial(fn, bug=False))]


SCENARIOS = [
    Scenario("ref-dense", 1, functools.partial(reference, ignore=False)),
    Scenario("ref-seq", 1, functools.partial(reference, ignore=True)),
    *_pair("megatron-673", megatron_673, 4),
    *_pair("veomni-338", veomni_338, 4),
    *_pair("veomni-1115", veomni_1115, 2),
    *_pair("verl-2855", verl_2855, 2),
    *_pair("hf-34191", hf_34191, 2),
    *_pair("nemo-3830", nemo_3830, 1),
]
