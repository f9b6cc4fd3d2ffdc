"""The collectives the #5248 loop (tools/repro/ds5248/loop.py) renders for torch < 2.2's gloo (which has no reduce-scatter and no
all_gather_into_tensor), checked against gloo's own collectives in this torch, which has them: two and three
real gloo ranks on 127.0.0.1, every rank's output compared element for element. Integer-valued inputs make
every sum exact, so summation order cannot hide a wrong chunk or a wrong op."""

import os
import socket
import sys

import pytest
import torch
import torch.distributed as tdist
import torch.multiprocessing as mp

from conftest import ROOT

sys.path.insert(0, str(ROOT / "tools" / "repro" / "ds5248"))
import loop  # noqa: E402  (tools/repro/ds5248/loop.py)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank(rank, world, port, results):
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    tdist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        g = torch.Generator().manual_seed(100 + rank)
        n = 5  # elements per rank's chunk
        inp = torch.randint(-50, 50, (world * n,), generator=g).float()
        out = {}
        for op in (tdist.ReduceOp.SUM, tdist.ReduceOp.MAX):
            native, rendered, listed = torch.empty(n), torch.empty(n), torch.empty(n)
            tdist.reduce_scatter_tensor(native, inp.clone(), op=op)
            loop.reduce_scatter_tensor_via_all_reduce(rendered, inp.clone(), op)
            loop.reduce_scatter_list_via_all_reduce(listed, list(inp.clone().chunk(world)), op)
            out[str(op)] = (native, rendered, listed)
        native, rendered = torch.empty(world * n), torch.full((world * n,), float("nan"))
        mine = inp[:n].clone()
        tdist.all_gather_into_tensor(native, mine)
        loop.all_gather_into_tensor_via_list(rendered, mine)
        out["all_gather"] = (native, rendered, rendered)
        results[rank] = out
    finally:
        tdist.destroy_process_group()


@pytest.mark.parametrize("world", [2, 3])
def test_renderings_equal_gloo_native(world):
    results = mp.Manager().dict()
    mp.spawn(_rank, args=(world, _free_port(), results), nprocs=world, join=True)
    assert sorted(results.keys()) == list(range(world))
    for rank, out in results.items():
        for name, (native, rendered, listed) in out.items():
            assert torch.equal(native, rendered), (rank, name, native, rendered)
            assert torch.equal(native, listed), (rank, name, native, listed)
        # the SUM chunk is really this rank's chunk of the sum, not a copy of the input
        total = sum(torch.randint(-50, 50, (world * 5,), generator=torch.Generator().manual_seed(100 + r)).float()
                    for r in range(world))
        assert torch.equal(out[str(tdist.ReduceOp.SUM)][0], total[rank * 5:(rank + 1) * 5])
