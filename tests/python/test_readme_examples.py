"""The README's and python/README's examples run as written; every README block is claimed by a test. Code
blocks are read out of the two files (not copied here), so an edit that breaks an example breaks this test. Shell blocks run line by
line from a scratch directory that links build/, finding the commands by name as `. .venv/bin/activate`
does (tools/setup links them to this build's binaries); Python blocks run in one real process with a
1-rank gloo group and the few names the prose assumes (a model, a gradient tensor, a process group)."""

import inspect
import os
import pathlib
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


README = (ROOT / "README.md").read_text()


def all_blocks():
    """Every fenced block of README.md as (language, text)."""
    return re.findall(r"^```(\w*)\n(.*?)^```", README, re.S | re.M)


def block_with(lang, marker):
    (block,) = [text for language, text in all_blocks() if language == lang and marker in text]
    return block


# Each README block, by a line only it holds, and the test that runs it (the wheel's: tools/wheel-check).
CLAIMED = {"Verdict: scaled -- B/A = 2.000 = dp(B)": "test_readme_ddp_example_runs_as_written",
           "./tools/demo": "test_readme_two_commands, test_readme_main_job_the_demo_runs",
           "auditwheel repair": "tools/wheel-check (tests/wheel/readme_wheel_block.py)",
           "# train.py": "test_readme_ddp_example_runs_as_written",
           "torchrun --nproc-per-node 2 train.py traces/dp2-bug 2": "test_readme_ddp_example_runs_as_written",
           "gradtrace-pack": "test_readme_5248_and_bug_report_blocks_run_as_written",
           "gradtrace-versions --package": "test_versions_command.py (its ergas fixture runs it)",
           "gradtrace-matrix --script": "test_matrix.py (its grid fixture runs it)",
           "gradtrace-train --nproc 2": "test_readme_5248_and_bug_report_blocks_run_as_written",
           'mode="guard"': "test_readme_guard_blocks_run_as_written",
           "gradtrace guard: rank 0: step 0": "test_readme_guard_blocks_run_as_written"}


def test_every_readme_block_is_run_by_a_test():
    found = all_blocks()
    assert len(found) == len(CLAIMED), [text.splitlines()[0] for _, text in found]
    for _, text in found:
        assert sum(marker in text for marker in CLAIMED) == 1, text.splitlines()[0]
    assert len(README.splitlines()) < 200


def test_readme_two_commands():
    lines = commands(block_with("sh", "./tools/demo"))
    assert lines == ["./tools/demo", "./tools/test"]
    for line in lines:
        path = ROOT / line
        assert os.access(path, os.X_OK), line
        assert subprocess.run(["bash", "-n", str(path)]).returncode == 0, line
    assert "exec ./tools/test" in (ROOT / ".ci" / "run").read_text()  # CI runs the README's test command


def test_readme_main_job_the_demo_runs(tmp_path):
    """The first command: the #5248 scenario end to end (tools/setup finds everything in place: seconds)."""
    env = dict(os.environ, GRADTRACE_DEMO_OUT=str(tmp_path / "demo"))  # GRADTRACE_BUILD_DIR as the suite has it
    p = subprocess.run([str(ROOT / "tools" / "demo")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]
    summary = {m.group(1): (int(m.group(2)), m.group(3)) for m in
               re.finditer(r"^  (sp=2, .*?)\s+exit (\d)  (.*)$", p.stdout, re.M)}
    assert {k: v[0] for k, v in summary.items()} == {
        "sp=2, backward(loss)": 1, "sp=2, backward(loss / sp)": 0, "sp=2, unequal shards, backward(loss / sp)": 1,
        "sp=2, unequal shards, token-weighted loss": 0}
    assert summary["sp=2, backward(loss)"][1].startswith("B/A = 2.000 = sp(B) for all 29 parameters")
    assert summary["sp=2, backward(loss / sp)"][1] == "all 29 parameters match"


def test_readme_ddp_example_runs_as_written(tmp_path):
    """'Capture your training': train.py as printed, its five commands, and the report the README shows."""
    (tmp_path / "train.py").write_text(block_with("python", "# train.py"))
    lines = commands(block_with("sh", "train.py traces/dp2-bug"))
    assert len(lines) == 5, lines
    outputs = []
    for line, want in zip(lines, [0, 0, 0, 0, 1]):
        rc, out = run(line, tmp_path)
        assert rc == want, f"{line}: exit {rc}\n{out[-3000:]}"
        outputs.append(out)
    assert "Verdict: match -- all 4 parameters match" in outputs[2]
    shown = block_with("text", "Verdict: scaled")
    printed = outputs[4].splitlines()
    for line in shown.splitlines():
        assert line == "..." or line in printed, line


def test_readme_5248_and_bug_report_blocks_run_as_written(scratch):
    """'The DeepSpeed #5248 question' on gradtrace-train, then 'Send a bug report' on its traces."""
    lines = commands(block_with("sh", "gradtrace-train --nproc 2"))
    assert len(lines) == 3, lines
    for line, want in zip(lines, [0, 0, 1]):  # train, train; the diff finds the 2x (sp(B))
        rc, out = run(line, scratch)
        assert rc == want, f"{line}: exit {rc}\n{out[-3000:]}"
    assert "B/A = 2.000 = sp(B)" in out and "use backward(loss / sp)" in out
    (scratch / "ds_config.json").write_text('{"zero_optimization": {"stage": 2}}\n')
    for line, want in zip(commands(block_with("sh", "gradtrace-pack")), [0, 1, 0]):
        rc, out = run(line, scratch)
        assert rc == want, f"{line}: exit {rc}\n{out[-3000:]}"


def test_readme_guard_blocks_run_as_written(tmp_path):
    """'Guard a long run': the README's attach line inside a 2-rank DDP run whose loss is a global token sum
    (tests/python/readme_guard_run.py); stderr holds the line the README shows."""
    line = block_with("python", 'mode="guard"').strip()
    p = subprocess.run([sys.executable, str(ROOT / "tests" / "python" / "readme_guard_run.py"), str(tmp_path / "g"),
                        line], capture_output=True, text=True, timeout=180)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    shown = block_with("text", "gradtrace guard: rank 0: step 0").strip()
    assert shown in p.stderr.splitlines(), p.stderr[-3000:]


def test_readme_states_the_code():
    """The format version, the command list and the attach options the README names are the code's."""
    major, minor = gradtrace.FORMAT_VERSION
    assert re.findall(r"format (\d+\.\d+)", README) == [f"{major}.{minor}"]
    (listed,) = re.findall(r"puts the commands on PATH: (.*?)\.\n", README, re.S)
    names = re.findall(r"`(gradtrace-[\w-]+)`", listed)
    venv_bin = pathlib.Path(sys.executable).parent
    assert sorted(names) == sorted(p.name for p in venv_bin.glob("gradtrace-*")), names
    calls = re.findall(r"gradtrace\.attach\(([^`]*?)\)", README)
    assert len(calls) >= 6
    options = {name for call in calls for name in re.findall(r"(\w+)=", call)}
    assert options and options <= set(inspect.signature(gradtrace.attach).parameters), options


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
