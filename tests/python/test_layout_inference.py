"""Issue 19, item 5: expert parallelism without rules= (the expert parameters of common MoE layouts
found by name, the expert-data-parallel groups derived from the ep groups), the inference written into
the trace (RunInfo.extra["inferred"]) and shown by gradtrace-inspect. Real gloo, 4 processes: ep 2
({0,1}, {2,3}), so edp {0,2} and {1,3}."""

import subprocess

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import gradtrace
from conftest import BUILD


class Moe(torch.nn.Module):
    """A router, two local experts (Mixtral-style names), a shared expert (dense), a head."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.gate = torch.nn.Linear(4, 2)
        self.experts = torch.nn.ModuleList([torch.nn.Linear(4, 4) for _ in range(2)])
        self.shared_experts = torch.nn.Linear(4, 4)
        self.head = torch.nn.Linear(4, 1)

    def forward(self, x):
        w = torch.softmax(self.gate(x), -1)
        y = sum(w[:, i:i + 1] * e(x) for i, e in enumerate(self.experts)) + self.shared_experts(x)
        return self.head(y)


def _rank(rank, store_path, out):
    dist.init_process_group("gloo", store=dist.FileStore(store_path, 4), rank=rank, world_size=4)
    ep = [rank - rank % 2, rank - rank % 2 + 1]
    model = Moe()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, out, optimizer=opt, groups={"ep": ep}, loss="local-mean")
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    cap.close()
    dist.destroy_process_group()


def test_experts_found_by_name_and_edp_from_the_ep_groups(tmp_path):
    out = tmp_path / "moe"
    mp.spawn(_rank, args=(str(tmp_path / "store"), str(out)), nprocs=4, join=True)
    readers = gradtrace.read_trace_set(out)
    for r in readers:
        info = r.run_info
        kinds = {p["name"]: (p["kind"], p["grad_group"]) for p in info["params"]}
        assert kinds["experts.0.weight"] == ("EXPERT", "edp") and kinds["experts.1.bias"] == ("EXPERT", "edp")
        assert kinds["shared_experts.weight"][0] == "DENSE" and kinds["gate.weight"][0] == "DENSE"
        groups = {g["name"]: g["ranks"] for g in info["groups"]}
        assert groups["edp"] == [r.rank % 2, r.rank % 2 + 2], groups
        assert info["config"]["edp"] == 2 and info["config"]["ep_size"] == 2
        assert "expert parameters by name" in info["extra"]["inferred"]
    p = subprocess.run([str(BUILD / "bin" / "gradtrace-inspect"), str(out / "rank-00003.gtrace")],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "inferred     edp group [1, 3] from every rank's ep group; expert parameters by name" in p.stdout
