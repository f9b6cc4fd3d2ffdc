"""Issue 19: the README's and python/README's examples run as written. Code blocks are read out of the
two files (not copied here), so an edit that breaks an example breaks this test. Shell blocks run line by
line from a scratch directory that links build/, finding the commands by name as `. .venv/bin/activate`
does (tools/setup links them to this build's binaries); Python blocks run in one real process with a
1-rank gloo group and the few names the prose assumes (a model, a gradient tensor, a process group)."""

import os
import re
import shlex
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

import gradtrace
from conftest import BUILD, ROOT


def blocks(path, lang):
    """The fenced code blocks of ``lang`` in ``path``, in order."""
    text = (ROOT / path).read_text()
    return re.findall(rf"^```{lang}\n(.*?)^```", text, re.S | re.M)


def commands(block):
    """The shell block's command lines (comments and the `. .venv/bin/activate` line dropped)."""
    out = []
    for line in block.splitlines():
        line = line.split("  #")[0].strip()
        if line and not line.startswith("#") and line != ". .venv/bin/activate":
            out.append(line)
    return out


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    (d / "build").symlink_to(BUILD.resolve())
    return d


def run(line, cwd):
    # PATH as the activated .venv has it, this build's binaries first (a shared .venv links another's).
    path = os.pathsep.join([str(BUILD.resolve() / "bin"), os.path.dirname(sys.executable), os.environ["PATH"]])
    p = subprocess.run(shlex.split(line), cwd=cwd, capture_output=True, text=True, timeout=600,
                       env={**os.environ, "PATH": path})
    return p.returncode, p.stdout + p.stderr


def test_readme_capture_and_diff_block_runs_as_written(scratch):
    """'Using it on your own runs': captures, inspects and diffs the #5248 pair; then 'Sending a bug report'."""
    (block,) = [b for b in blocks("README.md", "sh") if "gradtrace-train --nproc 4" in b]
    lines = commands(block)
    assert len(lines) == 6, lines
    expected = [0, 0, 0, 1, 1, 1]  # train, train, inspect; the diff and --self find the 2x (sp(B))
    for line, want in zip(lines, expected):
        rc, out = run(line, scratch)
        assert rc == want, f"{line}: exit {rc}\n{out[-3000:]}"
    assert "B/A = 2.000 = sp(B)" in (scratch / "report.md").read_text()
    (pack,) = [b for b in blocks("README.md", "sh") if "gradtrace-pack" in b]
    (scratch / "ds_config.json").write_text('{"zero_optimization": {"stage": 2}}\n')
    for line, want in zip(commands(pack), [0, 1, 0]):
        rc, out = run(line, scratch)
        assert rc == want, f"{line}: exit {rc}\n{out[-3000:]}"


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc = torch.nn.Linear(8, 4)

    def forward(self, x):
        return self.fc(x)


def test_python_readme_blocks_run_as_written(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    found = blocks("python/README.md", "python")
    assert len(found) == 3, [b[:40] for b in found]
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        # The API block: the writer, then the reader over what it wrote.
        ns = {"grad_tensor": torch.randn(64, 64, dtype=torch.bfloat16)}
        exec(compile(found[0], "python/README.md:api", "exec"), ns)
        (reader,) = gradtrace.read_trace_set(tmp_path / "trace")
        assert [f["phase"] for f in reader.frames() if f["type"] == "bucket"] == ["PRE_REDUCE", "FINAL"]
        # DDP: the two lines, then a training step through them.
        from torch.nn.parallel import DistributedDataParallel as DDP
        ns = {"DDP": DDP, "net": Net(), "torch": torch, "gradtrace": gradtrace}
        exec(compile(found[1], "python/README.md:ddp", "exec"), ns)
        ns["model"](torch.randn(2, 8)).sum().backward()
        ns["opt"].step()
        ns["cap"].close()
        assert ns["cap"].recorder.recorded["FINAL"] == 1 and ns["cap"].recorder.recorded["POST_REDUCE"] >= 1
        # Hand-written context parallelism: the around() block over a declared group.
        model = Net()
        model(torch.randn(2, 8)).sum().backward()
        ns = {"gradtrace": gradtrace, "model": model, "opt": torch.optim.SGD(model.parameters(), lr=0.1),
              "cp_group": dist.new_group([0]), "params": list(model.parameters()), "dist": dist}
        exec(compile(found[2], "python/README.md:manual", "exec"), ns)
        ns["opt"].step()
        ns["cap"].close()
        assert ns["cap"].recorder.recorded["PRE_REDUCE"] == 1 and ns["cap"].recorder.recorded["POST_REDUCE"] == 1
    finally:
        dist.destroy_process_group()
