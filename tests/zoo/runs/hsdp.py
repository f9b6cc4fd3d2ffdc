"""PyTorch issue #155903: FSDP2's ``set_reduce_scatter_divide_factor`` is applied to the
reduce-scatter over the shard group, and under HSDP the all-reduce over the replicate group then
sums without dividing, so HSDP's gradients come out x the replicate degree where plain FSDP's are
right. A plain-PyTorch rendering of that arithmetic on 4 ranks (shard groups {0,1} and {2,3},
replicate groups {0,2} and {1,3}; each rank one row, local-mean loss): the flat gradient is
reduce-scattered over the shard group and divided by the factor, then all-reduced over the
replicas. Right: factor = dp = 4 (the shard group's 2 x the replicate's 2). Bug: the factor covers
the shard group only (2) = replicate x. (FSDP2 itself runs on CPU here, tests/python; its current
release has the fix, so the buggy arithmetic is written out.) The trace records HSDP as format 1.3
does: Config.replicate 2, groups "shard" and "replicate", POST_REDUCE of group "shard" after the
replicas' all-reduce."""

import functools

import torch.distributed as dist

from zoo_model import batch, capture, ce_sum, make_lm, reduce_scatter_flat

from . import Scenario


def hsdp(ranks, out, *, bug):
    rank = ranks.rank
    shard = [rank - rank % 2, rank - rank % 2 + 1]
    replicate = [rank % 2, rank % 2 + 2]
    net = make_lm()
    cap = capture(net, out, rank, 4, degrees={"dp": 4, "replicate": 2}, groups={"shard": shard, "replicate": replicate},
                  default_group="shard", loss="local-mean",
                  loss_description="mean CE over the rank's tokens; reduce-scatter over the shard group / "
                                   + ("shard size" if bug else "dp") + ", all-reduce (sum) over the replicas",
                  config={"zero_stage": 3})
    tokens, labels = batch(0, False)
    t, y = tokens[rank:rank + 1], labels[rank:rank + 1]
    loss = ce_sum(net(t), y) / y.numel()
    loss.backward()
    cap.record_step(loss, y.numel())
    params = list(net.parameters())
    group = ranks.group(replicate)
    final = reduce_scatter_flat(cap, params, ranks.group(shard), "shard", shard.index(rank), 2, 2 if bug else 4,
                                then=lambda part: dist.all_reduce(part, group=group))
    cap.recorder.write_final(final)
    cap.recorder.end_optimizer_step(None)
    cap.close()


SCENARIOS = [Scenario("hsdp-155903-bug", 4, functools.partial(hsdp, bug=True)),
             Scenario("hsdp-155903-ok", 4, functools.partial(hsdp, bug=False))]
