"""Mixture-of-experts runs on 4 ranks (zoo_model.MoELM, 4 experts, one row of 16 tokens per data-
parallel rank, each rank's loss its local token mean, so the right divisor of every gradient summed
over all ranks' losses is dp = 4). Expert parallel: ep 2 (ranks {0,1} and {2,3} each hold 2 of the
4 experts, rows dispatched over the ep group), expert gradients summed over the expert-data-parallel
group (edp 2: {0,2}, {1,3}), dense gradients over all 4.

DeepSpeed's MoE needs its own launcher and Megatron/torchtitan do not run here: each function is a
plain-PyTorch rendering of the report's reduction arithmetic (real gloo collectives and autograd)."""

import functools

import torch

from zoo_model import BATCH, EXPERTS, batch, capture, ce_sum, grad_norm, make_moe, reduce_grads, reduce_scatter_flat

from . import Scenario

EXPERT_RULE = r"^experts\."


def _split(params):
    params = list(params)
    dense = [p for n, p in params if not n.startswith("experts.")]
    experts = [p for n, p in params if n.startswith("experts.")]
    return dense, experts


def _touch(experts):
    """An expert no token reached still takes part in its reduction (with a zero gradient), as in
    the frameworks, and in FINAL."""
    for p in experts:
        if p.grad is None:
            p.grad = torch.zeros_like(p)


def reference(ranks, out):
    """One rank, every expert, the whole batch: mean CE over every token."""
    net = make_moe()
    cap = capture(net, out, 0, 1, degrees={}, loss="global-token-weighted", config={"moe_experts": EXPERTS},
                  loss_description="mean CE over every token of the batch")
    tokens, labels = batch(0, False)
    loss = ce_sum(net(tokens), labels) / labels.numel()
    loss.backward()
    cap.record_step(loss, labels.numel())
    _touch(net.parameters())
    cap.step(grad_norm(net.parameters()))
    cap.close()


def _ep_forward(ranks, net, cap):
    """dp 4 x ep 2: this rank's row through the experts of its ep group; returns the groups."""
    rank = ranks.rank
    ep = [rank - rank % 2, rank - rank % 2 + 1]
    edp = [rank % 2, rank % 2 + 2]
    tokens, labels = batch(0, False)
    t, y = tokens[rank:rank + 1], labels[rank:rank + 1]
    loss = ce_sum(net(t, ep_group=ranks.group(ep)), y) / y.numel()
    loss.backward()
    cap.record_step(loss, y.numel())
    return {"ep": ep, "edp": edp}


def expert_parallel(ranks, out, *, expert_div, dense_div=4, partition=False, description=""):
    """The ep 2 run: dense gradients summed over the 4 ranks / ``dense_div``, expert gradients
    summed over edp / ``expert_div`` (4 is right). ``partition``: ZeRO-2's reduce-scatter of the
    expert bucket (each edp rank keeps and writes its half of the flat bucket)."""
    rank = ranks.rank
    net = make_moe()
    groups = {"ep": [rank - rank % 2, rank - rank % 2 + 1], "edp": [rank % 2, rank % 2 + 2]}
    cap = capture(net, out, rank, 4, degrees={"dp": 4, "ep": 2, "edp": 2}, groups=groups, default_group="world",
                  rules=[(EXPERT_RULE, {"kind": "EXPERT", "grad_group": "edp"})], loss="local-mean",
                  loss_description="mean CE over the rank's tokens; " + description,
                  config={"moe_experts": EXPERTS})
    _ep_forward(ranks, net, cap)
    dense, experts = _split(net.named_parameters())
    per = EXPERTS // 2
    experts = experts[2 * per * (rank % 2):2 * per * (rank % 2 + 1)]  # this rank's experts (ep rank = rank % 2)
    _touch(experts)
    with cap.around("world", dense, divisor=dense_div):
        reduce_grads(dense, ranks.group(range(4)), dense_div)
    edp = ranks.group(groups["edp"])
    if not partition:
        with cap.around("edp", experts, divisor=expert_div):
            reduce_grads(experts, edp, expert_div)
        # the norm a framework logs: the ep group's experts (squares summed over it) and the dense params
        sq = grad_norm(experts).pow(2)
        torch.distributed.all_reduce(sq, group=ranks.group(groups["ep"]))
        cap.step(torch.sqrt(sq + grad_norm(dense).pow(2)))
    else:
        final = reduce_scatter_flat(cap, experts, edp, "edp", groups["edp"].index(rank), 2, expert_div, bucket_id=1)
        rec = cap.recorder
        rec.write_final([(rec.param_id(p), 0, p.grad) for p in dense] + final)
        rec.end_optimizer_step(None)
    cap.close()


def tensor_parallel_moe(ranks, out, *, bug):
    """Megatron-LM PR #7160, generalized TP + MoE: tp 2 x dp 2, every expert on every rank (expert
    tp 1), the two tp ranks of a dp rank see the same rows, so their expert gradients are equal
    copies. Right: experts summed over dp / dp, like the dense parameters. Bug: experts summed over
    the dp x tp ranks and divided by dp = tp x."""
    rank = ranks.rank
    d, t = divmod(rank, 2)
    groups = {"tp": [d * 2, d * 2 + 1], "dp": [t, t + 2]}
    net = make_moe()
    expert_group = "world" if bug else "dp"
    cap = capture(net, out, rank, 4, degrees={"dp": 2, "tp": 2}, groups=groups, default_group="dp",
                  rules=[(EXPERT_RULE, {"kind": "EXPERT", "grad_group": expert_group})], loss="local-mean",
                  loss_description="mean CE over the dp rank's tokens; expert gradients summed over "
                                   + ("dp x tp" if bug else "dp") + " / dp", config={"moe_experts": EXPERTS})
    tokens, labels = batch(0, False)
    rows = BATCH // 2
    tk, y = tokens[d * rows:(d + 1) * rows], labels[d * rows:(d + 1) * rows]
    loss = ce_sum(net(tk), y) / y.numel()
    loss.backward()
    cap.record_step(loss, y.numel())
    dense, experts = _split(net.named_parameters())
    _touch(experts)
    with cap.around("dp", dense, divisor=2):
        reduce_grads(dense, ranks.group(groups["dp"]), 2)
    with cap.around(expert_group, experts, divisor=2):
        reduce_grads(experts, ranks.group(range(4) if bug else groups["dp"]), 2)
    cap.step(grad_norm(net.parameters()))
    cap.close()


SCENARIOS = [
    Scenario("ref-moe", 1, reference),
    Scenario("ep-ok", 4, functools.partial(expert_parallel, expert_div=4,
                                           description="expert gradients summed over edp / dp")),
    # DeepSpeed PR #5259 (bf16 optimizer) and issue #6545 (ZeRO): expert gradients / edp instead of / dp
    Scenario("ds-5259-bug", 4, functools.partial(expert_parallel, expert_div=2,
                                                 description="expert gradients all-reduced over edp / edp")),
    Scenario("ds-6545-bug", 4, functools.partial(expert_parallel, expert_div=2, partition=True,
                                                 description="expert bucket reduce-scattered over edp / edp")),
    Scenario("ds-6545-ok", 4, functools.partial(expert_parallel, expert_div=4, partition=True,
                                                description="expert bucket reduce-scattered over edp / dp")),
    # PyTorch issue #160285 (torchtitan EP): every gradient divided by the mesh size without ep
    Scenario("titan-160285-bug", 4, functools.partial(expert_parallel, expert_div=2, dense_div=2,
                                                      description="every gradient / (dp / ep)")),
    Scenario("megatron-7160-bug", 4, functools.partial(tensor_parallel_moe, bug=True)),
    Scenario("megatron-7160-ok", 4, functools.partial(tensor_parallel_moe, bug=False)),
]
