"""Where a mismatch enters the model (issue 48 item 1, diff/explain/localise.h), on a real transformers Mixtral
model (tests/python/moe_aux_run.py: built from a config, one SGD step, the model's own loss with its router
auxiliary loss). B doubles router_aux_loss_coef: the auxiliary part of the gradient is 2x A's, the main part the
same, so every parameter that feeds a router differs by no single factor (a mismatch) and the last layer's experts,
the final norm and the head agree. The report must say the difference enters at the last router,
'model.layers.1.mlp.gate', in JSON (schema 1.9 `localisation`), text, Markdown and HTML (the chart rings the
router's mark) — not at the layer norms transformers registers after the MLP.

With a baseline (issue 48 item 2: the same run with the coefficient 0), `gradtrace-diff A B --baseline C`
compares the auxiliary parts: B's is 2.000 x A's for every parameter it reaches, none for those it does not."""

import json
import subprocess
import sys

import pytest

from conftest import BUILD, ROOT, deepspeed_env

RUN = ROOT / "tests" / "python" / "moe_aux_run.py"
DIFF = BUILD / "bin" / "gradtrace-diff"


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("moe-aux")
    # c: a again (same result); zero, zero2: the baseline, the auxiliary loss switched off (coefficient 0)
    for name, coef in (("a", "0.01"), ("b", "0.02"), ("c", "0.01"), ("zero", "0"), ("zero2", "0")):
        p = subprocess.run([sys.executable, str(RUN), str(tmp / name), coef], env=deepspeed_env(), capture_output=True,
                           text=True, timeout=300)
        assert p.returncode == 0, p.stderr[-3000:]
    return tmp


def _diff(runs, a, b, *extra):
    return subprocess.run([str(DIFF), str(runs / a), str(runs / b), *map(str, extra)], capture_output=True, text=True,
                          timeout=120)


def test_a_scaled_auxiliary_loss_is_localised_at_the_last_router(runs):
    p = _diff(runs, "a", "b", "--json", runs / "d.json", "--markdown", runs / "d.md", "--html", runs / "d.html")
    assert p.returncode == 1, p.stderr
    report = json.loads((runs / "d.json").read_text())
    assert report["schema_version"] == "1.9"
    (g,) = [g for g in report["groups"] if g["kind"] == "mismatch"]
    where = g["localisation"]
    assert (where["module"], where["within"], where["param"]) == ("model.layers.1.mlp.gate", "model.layers.1.mlp",
                                                                  "model.layers.1.mlp.gate.weight")
    assert (where["differ_module"], where["differ_within"], where["agree_within"]) == (1, 1, 2)
    verdict = {q["name"]: q["verdict"] for q in report["params"]}
    assert (where["differ"], where["agree"]) == (g["count"], len(verdict) - g["count"])
    # what agrees is downstream of the last router or off its path
    for name in ("model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
                 "model.norm.weight", "lm_head.weight"):
        assert verdict[name] == "match", name
    for name in ("model.embed_tokens.weight", "model.layers.0.mlp.gate.weight", "model.layers.0.mlp.experts.down_proj",
                 "model.layers.1.input_layernorm.weight", "model.layers.1.post_attention_layernorm.weight"):
        assert verdict[name] == "mismatch", name
    words = ("it enters at 'model.layers.1.mlp.gate': of the parameters of 'model.layers.1.mlp', the 1 in it differs "
             f"and the 2 others agree with A; in all, {g['count']} of the model's {len(verdict)} parameters differ")
    assert g["explanation"].endswith(words)
    assert words in p.stdout and words in (runs / "d.md").read_text()
    html = (runs / "d.html").read_text()
    assert html.count('<circle class="boundary"') == 1 and "enters at model.layers.1.mlp.gate</text>" in html


def test_the_same_run_twice_has_no_localisation(runs):
    p = _diff(runs, "a", "c", "--json", runs / "same.json")
    assert p.returncode == 0, p.stdout
    report = json.loads((runs / "same.json").read_text())
    assert all(g["localisation"] is None for g in report["groups"])


# ---- decomposition with a baseline (issue 48 item 2): C is the same run with the auxiliary loss switched off ------

def test_the_auxiliary_part_is_2x_with_a_baseline(runs):
    """A - C and B - C are the auxiliary parts (coefficients 0.01 and 0.02): B's is 2.000 x A's for every parameter
    the auxiliary loss reaches, where the plain diff could only say 'not a multiple'."""
    _diff(runs, "a", "b", "--json", runs / "plain.json")
    plain = json.loads((runs / "plain.json").read_text())
    (mismatch,) = [g for g in plain["groups"] if g["kind"] == "mismatch"]
    p = _diff(runs, "a", "b", "--baseline", runs / "zero", "--json", runs / "t.json")
    assert p.returncode == 1, p.stderr
    report = json.loads((runs / "t.json").read_text())
    assert report["verdict"] == "scaled" and report["tolerance"]["source"] == "baseline"
    (g,) = [g for g in report["groups"] if g["kind"] == "scale" and abs(g["scale"] - 1) > 1e-6]
    assert abs(g["scale"] - 2.0) < 1e-4 and set(mismatch["params"]) <= set(g["params"])
    # the auxiliary loss does not reach the last layer's experts, the final norm or the head: no part to scale
    assert not {"model.layers.1.mlp.experts.gate_up_proj", "model.layers.1.mlp.experts.down_proj",
                "model.norm.weight", "lm_head.weight"} & set(g["params"])
    assert report["trace_a"]["dir"] == f"{runs / 'a'} - {runs / 'zero'}"
    notes = [f["message"] for f in report["findings"] if f["kind"] == "note"]
    assert any(n.startswith("decomposition: this report compares the term's part of each side") and
               n.endswith(f"the main part is the baseline {runs / 'zero'} on both sides") for n in notes), notes
    assert "gradtrace-diff: the term's part: A - " in p.stderr


def test_two_baselines_compare_the_main_parts_too(runs):
    p = _diff(runs, "a", "b", "--baseline", runs / "zero", "--baseline-b", runs / "zero2", "--json", runs / "t2.json")
    assert p.returncode == 1, p.stderr
    notes = [f["message"] for f in json.loads((runs / "t2.json").read_text())["findings"] if f["kind"] == "note"]
    assert any(f"the main part ({runs / 'zero'} against {runs / 'zero2'}): all 21 parameters match" in n for n in notes), notes


def test_a_baseline_of_another_model_is_bad_input(runs):
    other = next(p for p in sorted((ROOT / "tests" / "fixtures" / "format-1.6").iterdir()) if p.is_dir())
    p = _diff(runs, "a", "b", "--baseline", other)
    assert p.returncode == 2, p.stderr
    assert p.stderr.strip().endswith("the baseline is the same run with the term switched off"), p.stderr
    assert "--baseline " in p.stderr and "not the same model and world as" in p.stderr
