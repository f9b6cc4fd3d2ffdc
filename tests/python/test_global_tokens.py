"""A loss weighted by the global batch's valid tokens with the framework's own division switched off (issue 41
item 5): each rank's summed token loss over the valid tokens of all ranks (counted with an all-reduce; a quarter
of the labels ignored, so the ranks' counts differ), reduced by a sum, declared loss="global-token-sum". Real runs
on 2 gloo ranks (tests/python/adapter_runs.py --global-tokens): DDP with a comm hook that sums (divisor 1
declared), FSDP2 with set_gradient_divide_factor(1.0) on every fully_shard module (read by the adapter, recorded
and declared). Both are exact against one rank over the whole batch (ref-seq: the token mean of the batch), in
the diff (exit 0) and in --self (divisor 1 = what the recipe needs). The same loss with FSDP2's mean left on is
1/dp of the gradient: the diff names the divisor, --self says 2 where 1 is needed."""

import json
import subprocess

import pytest

import gradtrace

from conftest import BUILD, ROOT, script_runs

RUNS = ROOT / "tests" / "python" / "adapter_runs.py"
DIFF = BUILD / "bin" / "gradtrace-diff"
FLAGS = {"ref-seq": ("ref-seq", 1), "ddp": ("ddp", 2, "--global-tokens"), "fsdp2": ("fsdp2", 2, "--global-tokens"),
         "fsdp2-mean": ("fsdp2", 2, "--global-tokens", "--keep-division")}


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    def command(name, out):
        kind, world, *flags = FLAGS[name]
        return [RUNS, kind, world, out, "--steps", 2, *flags]

    return script_runs(tmp_path_factory, "global-tokens", command, timeout=300)


def diff(run, *args):
    report = run.root / f"r{abs(hash(args))}.json"
    p = subprocess.run([str(DIFF), *map(str, args), "--json", str(report)], capture_output=True, text=True,
                       timeout=120)
    return p.returncode, json.loads(report.read_text()), p.stdout


@pytest.mark.parametrize("layout", ["ddp", "fsdp2"])
def test_a_global_token_loss_with_a_summing_reduction_is_exact(run, layout):
    code, rep, out = diff(run, run("ref-seq"), run(layout))
    assert code == 0, out
    assert len(rep["params"]) == 8 and all(p["scale"] == pytest.approx(1.0, abs=1e-4) for p in rep["params"]), out
    code, rep, out = diff(run, "--self", run(layout))
    assert code == 0, out
    assert {(p["divisor"] is not None and round(p["divisor"], 4), p["expected"], p["verdict"])
            for p in rep["self_params"]} == {(1.0, 1.0, "ok")}, out


def test_fsdp2_records_its_divide_factor(run):
    info = gradtrace.read_trace_set(run("fsdp2"))[0].run_info
    assert info["extra"]["fsdp2_gradient_divide_factor"] == "1"
    assert info["config"]["scaling"] == "sum" and info["config"]["loss"] == "global-token-sum"
    posts = [f for f in gradtrace.read_trace_set(run("fsdp2"))[0].frames() if f.get("phase") == "POST_REDUCE"]
    assert posts and {f["divisor"] for f in posts} == {1.0}  # declared from the module's factor
    mean = gradtrace.read_trace_set(run("fsdp2-mean"))[0].run_info
    assert "fsdp2_gradient_divide_factor" not in mean["extra"] and mean["config"]["scaling"] == "mean"


def test_the_mean_left_on_is_named_as_the_divisor(run):
    code, rep, out = diff(run, run("ref-seq"), run("fsdp2-mean"))
    assert code == 1, out
    (group,) = rep["groups"]
    assert group["scale"] == pytest.approx(0.5, abs=1e-4) and group["count"] == 8
    assert (group["cause"], group["dimension"], group["side"]) == ("reduction-divisor", "dp", "B"), out
    assert group["explanation"].startswith("B/A = 0.500 = 1/dp(B) for all 8 parameters: B divides by dp once more "
                                           "than needed"), out
    code, rep, out = diff(run, "--self", run("fsdp2-mean"))
    assert code == 1, out
    assert {(round(p["divisor"], 4), p["expected"], p["verdict"]) for p in rep["self_params"]} == \
        {(2.0, 1.0, "wrong-divisor")}, out


def test_the_recipe_is_known_to_the_python_side():
    assert "global-token-sum" in gradtrace.loss_recipes.known()
