"""Where a mismatch enters the model (issue 48 item 1, diff/explain/localise.h), on a real transformers Mixtral
model (tests/python/moe_aux_run.py: built from a config, one SGD step, the model's own loss with its router
auxiliary loss). B doubles router_aux_loss_coef: the auxiliary part of the gradient is 2x A's, the main part the
same, so every parameter that feeds a router differs by no single factor (a mismatch) and the last layer's experts,
the final norm and the head agree. The report must say the difference enters at the last router,
'model.layers.1.mlp.gate', in JSON (schema 1.9 `localisation`), text, Markdown and HTML (the chart rings the
router's mark) — not at the layer norms transformers registers after the MLP."""

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
    for name, coef in (("a", "0.01"), ("b", "0.02"), ("c", "0.01")):
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
