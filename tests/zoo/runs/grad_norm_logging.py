"""The logging-only distractors: the gradients are right (dp 2, local-mean loss, DDP's average:
the same run as the reference) and only the grad norm the training reports is wrong. Plain-PyTorch
renderings of how each report computed its norm; the diff must say "gradients match" and by how
much the reported norm is off."""

import functools

import torch.distributed as dist

from zoo_model import grad_norm

from . import Scenario
from .sequence import train


def per_rank_shard(params, groups, summed):
    """ms-swift PR #8341: under ZeRO each rank holds a shard (here: every other parameter); the
    logged norm is the rank's own shard's, never all-reduced over the ranks."""
    rank = dist.get_rank(groups["world"])
    return grad_norm([p for k, p in enumerate(params) if k % 2 == rank])


def counted_per_rank(params, groups, summed):
    """MindSpore hyper-parallel issue #526: squared norms summed over the ranks as if every
    parameter were sharded, so replicated parameters count once per rank (x sqrt(dp))."""
    sq = grad_norm(params).pow(2)
    dist.all_reduce(sq, group=groups["world"])
    return sq.sqrt()


def before_division(params, groups, summed):
    """DeepSpeed issue #7837 (ZeRO-0 only): the norm is taken of the all-reduced sum, before the
    engine divides by dp (x dp)."""
    return summed


def _run(ranks, out, *, report_norm):
    train(ranks, out, dp=2, loss=lambda ce, local, micro, total: ce / local, recipe="local-mean",
          description="mean CE over the rank's tokens, gradients averaged over dp", report_norm=report_norm)


SCENARIOS = [
    Scenario("swift-8341-bug", 2, functools.partial(_run, report_norm=per_rank_shard)),
    Scenario("mindspore-526-bug", 2, functools.partial(_run, report_norm=counted_per_rank)),
    Scenario("ds-7837-bug", 2, functools.partial(_run, report_norm=before_division)),
]
