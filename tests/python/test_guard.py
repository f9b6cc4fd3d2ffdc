"""The live guard (gradtrace.attach(..., mode="guard"), python/gradtrace/guard) on real multi-process gloo runs:
DDP, FSDP2 and HSDP over adapter_runs.py's tiny LM, and guard_runs.py's runs of what goes wrong in the wild (a
rank that skips a step, dies, or meets NaN; an error inside the guard; hostile parameter names).

Asserted: a correct configuration (compressed communication and bf16 included) gives no violation and no line
on stderr; a planted bug is flagged at step 0 with the same cause and the same words as `gradtrace-diff --self`
on a trace of the very same run ("full+guard" writes both); "raise" stops the run at the violating step; a
skipped step, NaN, a dead rank and an internal error are what the issue asks (named, never a hang, training
goes on). The guard's log is JSON lines (events attach/scope/violation/disabled/summary).
"""

import json
import os
import re
import subprocess
import sys

import pytest

import gradtrace

from conftest import BUILD, ROOT, deepspeed_env

RUNS = ROOT / "tests" / "python" / "adapter_runs.py"
GUARD_RUNS = ROOT / "tests" / "python" / "guard_runs.py"
DIFF = BUILD / "bin" / "gradtrace-diff"


def _events(out, rank=0):
    path = out / f"rank-{rank:05d}.guard.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()]


def _violations(out, rank=0):
    return [e for e in _events(out, rank) if e["event"] == "violation"]


def _summary(out, rank=0):
    (s,) = [e for e in _events(out, rank) if e["event"] == "summary"]
    return s


def _adapter_run(out, kind, world, *flags, ok=True):
    cmd = [sys.executable, str(RUNS), kind, str(world), str(out), *flags]
    p = subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=240)
    if ok:
        assert p.returncode == 0, f"{' '.join(cmd)} failed ({p.returncode}):\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    return p


def _guard_run(out, scenario, *flags):
    cmd = [sys.executable, str(GUARD_RUNS), scenario, str(out), *flags]
    return subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=150)


def _self_report(trace, tmp_path):
    j = tmp_path / "self.json"
    p = subprocess.run([str(DIFF), "--self", str(trace), "--step", "0", "--json", str(j)], capture_output=True,
                       text=True, timeout=120)
    return p.returncode, json.loads(j.read_text())


def _step_lines(stderr):
    return [line for line in stderr.splitlines() if line.startswith("gradtrace guard: rank") and ": step " in line]


# ---- correct configurations: silent -------------------------------------------------------------------

CORRECT = {
    "ddp": ("ddp", 2, ["--steps", "2"]),
    "ddp-gas2": ("ddp", 2, ["--steps", "2", "--gas", "2"]),
    "ddp-gas2-sync": ("ddp", 2, ["--steps", "2", "--gas", "2", "--sync-micro-steps"]),
    "ddp-bf16-hook": ("ddp", 2, ["--steps", "2", "--hook", "bf16"]),
    "ddp-fp16-hook": ("ddp", 2, ["--steps", "2", "--hook", "fp16"]),
    "fsdp2": ("fsdp2", 2, ["--steps", "2"]),
    "fsdp2-bf16-reduce": ("fsdp2", 2, ["--steps", "2", "--mp", "bf16-reduce"]),
    "fsdp2-global-tokens": ("fsdp2", 2, ["--steps", "2", "--global-tokens"]),
    "cp": ("cp", 2, ["--steps", "2"]),
}


@pytest.mark.parametrize("name", sorted(CORRECT))
def test_a_correct_configuration_gives_no_violation(name, tmp_path):
    kind, world, flags = CORRECT[name]
    p = _adapter_run(tmp_path / "g", kind, world, *flags, "--mode", "guard")
    for rank in range(world):
        assert _violations(tmp_path / "g", rank) == []
        s = _summary(tmp_path / "g", rank)
        assert (s["steps_checked"], s["violations"], s["disabled"]) == (2, 0, None)
        assert s["bytes_sent_per_step"] > 0
    assert _step_lines(p.stderr) == [], p.stderr[-2000:]
    assert "gradtrace guard: rank 0: 2 steps checked, 0 violations" in p.stderr
    assert not list((tmp_path / "g").glob("*.gtrace")), "mode guard alone writes no trace"


def test_lossy_compression_is_a_scope_not_a_violation(tmp_path):
    """PowerSGD approximates the sum: no divisor can be claimed (--self: inconsistent, cause lossy-compression).
    The guard says once that it cannot check the divisor, and raises nothing."""
    # torch's PowerSGD compresses from its third iteration (test_compressed_comm.py)
    p = _adapter_run(tmp_path / "g", "ddp", 2, "--steps", "4", "--hook", "powersgd", "--mode", "guard")
    assert _violations(tmp_path / "g") == [] and _step_lines(p.stderr) == []
    scopes = [e for e in _events(tmp_path / "g") if e["event"] == "scope" and e["check"] == "divisor"]
    assert len(scopes) == 1 and "lossy" in scopes[0]["message"], scopes


# ---- planted bugs: step 0, the --self cause and words -----------------------------------------------------

def test_a_summing_hook_is_flagged_at_step_0_as_self_flags_it(tmp_path):
    p = _adapter_run(tmp_path / "g", "ddp", 2, "--steps", "2", "--bug", "--mode", "full+guard")
    code, report = _self_report(tmp_path / "g", tmp_path)
    assert code == 1 and report["verdict"] == "wrong-divisor"
    for rank in (0, 1):
        first = _violations(tmp_path / "g", rank)[0]
        assert (first["step"], first["check"], first["cause"]) == (0, "divisor", report["groups"][0]["cause"])
        assert first["cause"] == "reduction-divisor"
        assert first["message"] == report["groups"][0]["explanation"]  # the same words: one judging function
        assert "effective divisor 1.000" in first["message"] and "needs 2.000" in first["message"]
        assert sorted(first["params"]) == sorted(report["groups"][0]["params"])
    lines = _step_lines(p.stderr)
    assert len(lines) == 2, lines  # one line per rank: the repeat at step 1 is counted, not said again
    assert all(": step 0: bucket 0 (8 parameters): effective divisor 1.000" in line for line in lines)
    assert _summary(tmp_path / "g")["violations"] == 2


def test_fsdp2_dividing_a_global_token_sum_is_flagged(tmp_path):
    _adapter_run(tmp_path / "g", "fsdp2", 2, "--steps", "1", "--global-tokens", "--keep-division", "--mode",
                 "full+guard")
    code, report = _self_report(tmp_path / "g", tmp_path)
    assert code == 1
    first = _violations(tmp_path / "g")[0]
    assert (first["step"], first["cause"], first["message"]) == (0, report["groups"][0]["cause"],
                                                                report["groups"][0]["explanation"])
    assert first["divisor"] == pytest.approx(2.0, rel=1e-4)


def test_a_misreported_grad_norm_is_flagged(tmp_path):
    """FSDP2 with each rank reporting the norm of its own shard (ms-swift #8341's logging pattern)."""
    _adapter_run(tmp_path / "g", "fsdp2", 2, "--steps", "1", "--norm", "local", "--mode", "full+guard")
    (v,) = _violations(tmp_path / "g", 0)
    assert (v["step"], v["check"]) == (0, "grad-norm")
    code, report = _self_report(tmp_path / "g", tmp_path)
    assert code == 0 and report["grad_norm"]["verdict"] == "misreported"
    assert v["message"] == report["grad_norm"]["message"]
    assert _violations(tmp_path / "g", 1) == []  # the norm is said by the lowest rank only


def test_raise_stops_the_run_at_the_violating_step(tmp_path):
    p = _adapter_run(tmp_path / "g", "ddp", 2, "--steps", "3", "--bug", "--mode", "guard", "--on-violation",
                     "raise", ok=False)
    assert p.returncode != 0
    assert "GuardViolation" in p.stderr and "step 0: bucket 0 (8 parameters): effective divisor 1.000" in p.stderr
    assert [v["step"] for v in _violations(tmp_path / "g")] == [0]  # raised out of step 0's optimizer.step


# ---- every other attach path: the suite's own runners, unchanged, under the guard --------------------------

EVERYWHERE = ROOT / "tests" / "python" / "guard_everywhere"  # its sitecustomize sets every attach's mode
PATHS = {  # name: (runner, its arguments before OUT, after OUT); each a correct configuration
    "lightning-trainer-ddp-gas2": ("lightning_runs.py", ["trainer", "2", "2"], []),
    "lightning-trainer-fsdp2": ("lightning_runs.py", ["trainer", "2", "2"], ["--fsdp2"]),
    "lightning-fabric-closure": ("lightning_runs.py", ["fabric", "2", "2"], []),
    "hf-trainer-ddp": ("hf_runs.py", ["2"], []),
    "accelerate-ddp": ("hf_runs.py", ["2"], ["accelerate"]),
    "accelerate-deepspeed-zero2": ("hf_runs.py", ["2"], ["accelerate", "2"]),
    "dtensor-tp": ("dtensor_runs.py", ["tp", "2"], []),
    "dtensor-ddp-tp": ("dtensor_runs.py", ["ddp-tp", "4"], []),
    "pipeline-gpipe-pp2": ("pipeline_runs.py", ["gpipe"], ["--pp", "2"]),
}


@pytest.mark.parametrize("name", sorted(PATHS))
def test_every_attach_path_runs_silent_under_the_guard(name, tmp_path):
    runner, before, after = PATHS[name]
    out = tmp_path / "g"
    env = deepspeed_env()
    env["PYTHONPATH"] = os.pathsep.join([str(EVERYWHERE), env["PYTHONPATH"]])
    env["GRADTRACE_TEST_MODE"] = "guard"
    cmd = [sys.executable, str(ROOT / "tests" / "python" / runner), *before, str(out), *after]
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert p.returncode == 0, f"{' '.join(cmd)}: exit {p.returncode}\n{p.stdout[-2000:]}\n{p.stderr[-3000:]}"
    logs = sorted(out.glob("rank-*.guard.jsonl"))
    assert logs and not list(out.glob("*.gtrace")), "the guard ran alone on every rank"
    for log in logs:
        rank = int(log.name[5:10])
        s = _summary(out, rank)
        assert s["steps_checked"] >= 1 and s["disabled"] is None, (name, rank, s)
        assert _violations(out, rank) == [], (name, rank, _violations(out, rank))
    assert _step_lines(p.stderr) == [], p.stderr[-2000:]


# ---- a reference run: a trusted run's stats trace, compared step by step ----------------------------------------

@pytest.fixture(scope="module")
def stats_reference(tmp_path_factory):
    """One process over the whole batch (adapter_runs ref-dense), stats mode, 2 steps: what DDP must equal."""
    out = tmp_path_factory.mktemp("reference") / "ref"
    _adapter_run(out, "ref-dense", 1, "--mode", "stats", "--steps", "2")
    return out


@pytest.mark.parametrize("bug", [False, True])
def test_a_reference_run_is_compared_at_each_of_its_steps(stats_reference, bug, tmp_path):
    out = tmp_path / "g"
    _adapter_run(out, "ddp", 2, "--steps", "3", "--mode", "full+guard", "--reference", str(stats_reference),
                 *(["--bug"] if bug else []))
    against = [v for v in _violations(out) if v["check"] == "reference"]
    scopes = [e["message"] for e in _events(out) if e["event"] == "scope" and e["check"] == "reference"]
    assert [v for v in _violations(out, 1) if v["check"] == "reference"] == []  # the lowest rank says it
    if not bug:
        assert against == [] and _summary(out)["violations"] == 0
        assert scopes == ["reference is not checked: the reference recorded FINAL at steps [0, 1]: later steps are "
                          "not compared"]
        return
    (v,) = against  # step 0; then the run has left the reference: later steps start from other weights
    assert v["step"] == 0 and len(v["params"]) == 8 and v["cause"] == "reduction-divisor"
    assert v["message"].startswith("against the reference run (A): B/A = 2.000 = dp(B) for all 8 parameters: B sums")
    # the same words as gradtrace-diff on the reference and this run's trace
    j = tmp_path / "diff.json"
    subprocess.run([str(DIFF), str(stats_reference), str(out), "--step", "0", "--json", str(j)], capture_output=True,
                   timeout=120)
    assert v["message"] == "against the reference run (A): " + json.loads(j.read_text())["groups"][0]["explanation"]
    assert scopes == ["reference is not checked: the run differs from the reference at step 0: later steps start "
                      "from other weights and are not compared"]


def test_a_reference_that_cannot_be_read_is_one_line_before_anything_is_hooked(tmp_path):
    import torch

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=r"nowhere: no such directory"):
        gradtrace.attach(model, tmp_path / "g", mode="guard", reference=tmp_path / "nowhere")
    assert not model._forward_pre_hooks


# ---- DeepSpeed #5248 on real DeepSpeed (tools/repro/ds5248/run.py: sp 2, the Ulysses loop) ----------

DS5248 = {  # (zero stage, the loop's loss): a bug? (docs/studies/ds5248.md: ZeRO-2 sums the sp ranks' gradients,
    (2, "loss"): True,  # ZeRO-3's reduce-scatter averages them)
    (2, "loss-div-sp"): False,
    (3, "loss"): False,
    (3, "loss-div-sp"): True,
}


@pytest.mark.parametrize("stage, loss", sorted(DS5248))
def test_ds5248_configurations_under_the_guard(stage, loss, tmp_path):
    out = tmp_path / "g"
    cmd = [sys.executable, str(ROOT / "tools" / "repro" / "ds5248" / "run.py"), "--sp", "2", "--zero-stage",
           str(stage), "--loss", loss, "--capture", "full+guard", "--out", str(out)]
    p = subprocess.run(cmd, env=deepspeed_env(), capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-3000:]
    code, report = _self_report(out, tmp_path)
    for rank in (0, 1):
        found = _violations(out, rank)
        if not DS5248[(stage, loss)]:
            assert found == [] and code == 0
            continue
        assert code == 1 and found and found[0]["step"] == 0
        assert {v["cause"] for v in found} == {g["cause"] for g in report["groups"]} == {"reduction-divisor"}
        assert {round(v["divisor"], 3) for v in found} == {1.0 if stage == 2 else 2.0}
    assert len(_step_lines(p.stderr)) == (0 if not DS5248[(stage, loss)] else len(_violations(out, 0)) +
                                          len(_violations(out, 1)))


# ---- what goes wrong in the wild ---------------------------------------------------------------------------

def test_a_rank_that_skips_a_step_is_named(tmp_path):
    p = _guard_run(tmp_path / "g", "skip")
    assert p.returncode == 0 and "RANK 0 DONE" in p.stdout and "RANK 1 DONE" in p.stdout, p.stderr[-2000:]
    (v,) = _violations(tmp_path / "g", 0)
    assert (v["step"], v["check"]) == (1, "skipped-step")
    assert v["message"].startswith("rank 1 did not step the optimizer in step 1 while the other ranks did")
    assert _summary(tmp_path / "g")["steps_checked"] == 3


def test_nan_is_named_by_parameter_phase_and_bucket_at_its_first_step(tmp_path):
    p = _guard_run(tmp_path / "g", "nan")
    assert p.returncode == 0, p.stderr[-2000:]
    mine = [(v["step"], v["message"]) for v in _violations(tmp_path / "g", 1)]
    assert mine == [(2, "NaN or Inf in PRE_REDUCE of bucket 0 (group dp, micro-step 0) on rank 1: 'qkv.weight'"),
                    (2, "NaN or Inf in POST_REDUCE of bucket 0 (group dp, micro-step 0) on rank 1: 'qkv.weight'"),
                    (2, "NaN or Inf in FINAL (what the optimizer received) on rank 1: 'qkv.weight'")]
    assert [v["step"] for v in _violations(tmp_path / "g", 0)] == [2, 2]  # POST and FINAL: rank 0's PRE is finite


def test_a_rank_that_dies_after_its_last_step_never_holds_the_others(tmp_path):
    """Rank 1 dies before its last step ends, so it never sends that step's exchange; rank 0 ends its loop and closes
    (guard timeout 600 s: finishing within the test's 150 s means the guard did not wait for it), its guard disabled
    with one warning. (Dying after its last optimizer step, rank 1's guard thread sometimes sent that step before the
    process ended, and nothing failed.)"""
    p = _guard_run(tmp_path / "g", "die-end")
    assert p.returncode == 0 and "RANK 0 DONE" in p.stdout and "EXIT 1 3" in p.stdout, p.stdout + p.stderr[-2000:]
    # rank 1's own guard thread dies with it, maybe before it sent step 1's payload: the exchange that fails is
    # step 1's or step 2's; every step before it was checked
    (failed,) = re.findall(r"guard disabled: the exchange of step (\d) failed", p.stderr)
    assert int(failed) in (1, 2)
    assert _summary(tmp_path / "g")["steps_checked"] == int(failed)


def test_a_rank_that_dies_mid_step_fails_the_frameworks_collective_not_the_guards(tmp_path):
    p = _guard_run(tmp_path / "g", "die-mid")
    assert "EXIT 1 3" in p.stdout
    (raised,) = [line for line in p.stdout.splitlines() if line.startswith("RANK 0 RAISED")]
    assert "third_party/gloo" in raised and "gradtrace" not in raised  # gloo's error, in DDP's all-reduce
    assert [e["event"] for e in _events(tmp_path / "g")][:1] == ["attach"]


@pytest.mark.parametrize("on_violation", ["warn", "raise"])
def test_an_internal_error_disables_the_guard_unless_raise(on_violation, tmp_path):
    p = _guard_run(tmp_path / "g", "error", "--on-violation", on_violation)
    if on_violation == "warn":
        assert p.returncode == 0 and "RANK 1 DONE" in p.stdout
        assert p.stderr.count("guard disabled: internal error: RuntimeError: injected guard error") == 2
        s = _summary(tmp_path / "g")
        assert (s["steps_checked"], s["disabled"]) == (1, "internal error: RuntimeError: injected guard error")
    else:
        assert p.returncode == 1
        assert "RANK 0 RAISED RuntimeError: 'injected guard error'" in p.stdout


def test_hostile_parameter_names_reach_no_terminal(tmp_path):
    p = _guard_run(tmp_path / "g", "hostile")
    assert p.returncode == 0, p.stderr[-2000:]
    assert "\x1b" not in p.stderr and "\x07" not in p.stderr
    assert "on rank 1: 'evil\\x1b[2J\\x07name'" in p.stderr
    messages = [v["message"] for v in _violations(tmp_path / "g", 1)]
    assert "NaN or Inf in PRE_REDUCE of bucket 0 (group dp, micro-step 0) on rank 1: 'evil\x1b[2J\x07name'" in messages


# ---- one process, the options --------------------------------------------------------------------------------

def test_one_process_plain_module_says_what_it_cannot_check(tmp_path):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Linear(3, 2))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "g", optimizer=opt, mode="guard")
    for _ in range(3):
        model(torch.randn(5, 4)).square().mean().backward()
        cap.report_grad_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e9))
        opt.step()
        opt.zero_grad()
    cap.close()
    events = _events(tmp_path / "g")
    scopes = {e["check"] for e in events if e["event"] == "scope"}
    assert scopes == {"replicas", "divisor"}
    s = _summary(tmp_path / "g")
    assert (s["steps_checked"], s["violations"]) == (3, 0)


def test_guard_every_samples_after_the_first_four_steps_and_says_so(tmp_path, capfd):
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "g", optimizer=opt, mode="guard", guard_every=3)
    for _ in range(10):
        model(torch.randn(5, 4)).square().mean().backward()
        opt.step()
        opt.zero_grad()
    cap.close()
    assert _summary(tmp_path / "g")["steps_checked"] == 6  # 0, 1, 2, 3, then 6 and 9
    (sampling,) = [e for e in _events(tmp_path / "g") if e["event"] == "scope" and e["check"] == "sampling"]
    assert sampling["message"] == "from step 4 on, one step in 3 is checked (those divisible by 3)"
    err = capfd.readouterr().err
    assert err.count("gradtrace guard: note: replicas is not checked: one rank: no replica to compare") == 1
    assert err.count("gradtrace guard: note: divisor is not checked") == 1


def test_clipping_after_the_norm_is_no_violation(tmp_path):
    """clip_grad_norm_ reports the norm before it clips: FINAL is smaller than what is reported, and right."""
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    cap = gradtrace.attach(model, tmp_path / "g", optimizer=opt, mode="guard", phases=("FINAL",))
    model(torch.randn(5, 4)).square().sum().backward()
    cap.report_grad_norm(torch.nn.utils.clip_grad_norm_(model.parameters(), 1e-3))
    opt.step()
    cap.close()
    assert _violations(tmp_path / "g") == []


@pytest.mark.parametrize("bad, message", [
    ({"mode": "full+stats"}, "mode='full+stats': expected"),
    ({"mode": "guard", "on_violation": "shout"}, "on_violation='shout': expected 'warn', 'raise' or a callable"),
    ({"mode": "guard", "guard_every": 0}, "guard_every=0: expected an integer >= 1"),
])
def test_bad_guard_options_are_refused_before_anything_is_hooked(bad, message, tmp_path):
    import torch

    model = torch.nn.Linear(2, 2)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("+", r"\+")):
        gradtrace.attach(model, tmp_path / "g", **bad)
    assert not model._forward_pre_hooks


def test_the_exchange_thread_survives_a_failing_callback(capfd):
    """A callback that raises (a bug in the guard's own judging) is said once, terminal-safe, and the next step is
    still exchanged: the thread never dies silently."""
    from gradtrace.guard.exchange import Exchange

    ex = Exchange(1, 5)
    got = []

    def bad(payloads, nbytes, error):
        raise ValueError("boom \x1b[31m")

    ex.submit({"step": 0}, bad)
    ex.submit({"step": 1}, lambda payloads, nbytes, error: got.append((payloads, nbytes > 0, error)))
    assert ex.close(5)
    assert got == [([{"step": 1}], True, None)]
    err = capfd.readouterr().err
    assert err == "gradtrace guard: WARNING: internal error on the guard's thread: ValueError: boom \\x1b[31m\n"
