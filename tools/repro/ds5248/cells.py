"""The cells of the #5248 matrix: layouts, loss recipes and the extra cells around them."""

import itertools
import pathlib
import shutil
import subprocess
from dataclasses import dataclass

from gradtrace.adapters.rank_recorder import rank_file

RECIPES = ["loss", "loss-div-sp", "token-weighted", "full-sequence"]


@dataclass(frozen=True)
class Layout:
    sp: int
    dp: int
    moe: int = 0  # experts per MoE layer (deepspeed.moe.layer.MoE, ep_size 1); 0: dense
    gas: int = 1  # gradient_accumulation_steps
    contiguous: bool = True  # ZeRO contiguous_gradients
    reduce_scatter: bool = True  # ZeRO reduce_scatter (stage 3: which of its two reduction paths runs)
    bucket: int = 0  # ZeRO reduce_bucket_size in elements; 0: run.py's default (2000)


# ZeRO-3 with reduce_scatter false takes the all-reduce path (stage3.py __avg_scatter_contiguous_grads) only
# for buckets of at most reduce_bucket_size elements; a bucket holding a larger parameter still takes the
# reduce-scatter path. This bucket holds the whole tiny model, so every bucket takes the all-reduce path.
WHOLE_MODEL_BUCKET = 100000


LAYOUTS = {
    "dp2": Layout(1, 2),  # the per-stage sanity cell: pure data parallel must equal the reference
    "sp2": Layout(2, 1),
    "sp4": Layout(4, 1),
    "dp2xsp2": Layout(2, 2),
    "sp2-gas2": Layout(2, 1, gas=2),
    "sp2-nocontig": Layout(2, 1, contiguous=False),
    # MoE around PR #4957 (2 experts, ep_size 1). MoE runs the tiny model (DeepSpeed's MoE layer); its
    # emulation is compared by bucket divisors, not elementwise (emulation.py).
    "dp2-moe2": Layout(1, 2, moe=2),
    "sp2-moe2": Layout(2, 1, moe=2),
    # ZeRO-3's second path (reduce_scatter false); the tables show these as stage "3 rs=false".
    "dp2-rsoff": Layout(1, 2, reduce_scatter=False, bucket=WHOLE_MODEL_BUCKET),
    "sp2-rsoff": Layout(2, 1, reduce_scatter=False, bucket=WHOLE_MODEL_BUCKET),
    "sp4-rsoff": Layout(4, 1, reduce_scatter=False, bucket=WHOLE_MODEL_BUCKET),
    "dp2xsp2-rsoff": Layout(2, 2, reduce_scatter=False, bucket=WHOLE_MODEL_BUCKET),
    # reduce_scatter false with run.py's 2000-element buckets: parameters above 2000 elements take the
    # reduce-scatter path, the others the all-reduce path, in one run.
    "sp2-rsoff-b2000": Layout(2, 1, reduce_scatter=False),
    "sp2-rsoff-nocontig": Layout(2, 1, reduce_scatter=False, contiguous=False),
}
RSOFF = "-rsoff"  # layouts NAME-rsoff: NAME with ZeRO-3 reduce_scatter false
LAYOUT_ORDER = list(LAYOUTS)
SANITY = ("dp2", "loss", 0.0)  # layout, recipe, ignore of the per-stage sanity cell


def moe_versions():
    """The releases around PR #4957 (the last without it, the first with it) and the newest, read from the
    one DeepSpeed release table (semantics/deepspeed_releases.cc through _gtcodec)."""
    from gradtrace import _gtcodec
    releases = _gtcodec.deepspeed_releases()
    before = [r["version"] for r in releases if not r["has_pr4957"]]
    after = [r["version"] for r in releases if r["has_pr4957"]]
    return tuple(dict.fromkeys(before[-1:] + after[:1] + after[-1:]))


def extra_cells(version):
    """Cells beyond layouts x stages x recipes x ignore: gradient accumulation, contiguous_gradients
    false, global-token-weighted at dp2 x sp2 with unequal shards, MoE."""
    cells = [("sp2-gas2", s, r, 0.0) for s in (0, 1, 2) for r in ("loss", "loss-div-sp")]
    cells += [("sp2-nocontig", 2, r, 0.0) for r in ("loss", "loss-div-sp")]
    # The recipe that is exact for the global token mean when DP replicas hold unequal counts.
    cells += [("dp2xsp2", s, "global-token-weighted", 0.25) for s in (0, 1, 2)]
    cells += zero3_cells()
    if version in moe_versions():
        cells += [(l, 2, r, 0.0) for l in ("dp2-moe2", "sp2-moe2") for r in ("loss", "loss-div-sp")]
    return cells


def zero3_cells():
    """ZeRO-3's reduce_scatter-false path over the main matrix, and the cells around its two paths."""
    cells = [(l + RSOFF, 3, r, g) for l in ("sp2", "sp4", "dp2xsp2") for r in RECIPES for g in (0.0, 0.25)]
    cells += [(l, 3, "global-token-weighted", 0.25) for l in ("dp2xsp2", "dp2xsp2" + RSOFF)]
    cells += [("dp2" + RSOFF, 3, "loss", 0.0), ("sp2-gas2", 3, "loss", 0.0), ("sp2-nocontig", 3, "loss", 0.0)]
    cells += [(l, 3, r, 0.0) for l in ("sp2-rsoff-b2000", "sp2-rsoff-nocontig") for r in ("loss", "loss-div-sp")]
    return cells


def cell_name(layout, stage, recipe, ignore):
    return f"{layout}-z{stage}-{recipe}-ign{ignore}"


def priority_cells(stages, layouts, recipes, ignores, extra):
    """Cells in the order the study wants them: sp2 ZeRO-1/2 with loss and loss/sp first, then stage 0,
    the other recipes, unequal shards, sp4 and dp2 x sp2, the rest, and last the extra cells."""
    allc = list(itertools.product(layouts, stages, recipes, ignores))
    phases = [
        lambda c: c[0] == "sp2" and c[1] in (1, 2) and c[2] in ("loss", "loss-div-sp") and c[3] == 0,
        lambda c: c[0] == "sp2" and c[2] in ("loss", "loss-div-sp") and c[3] == 0,
        lambda c: c[0] == "sp2" and c[3] == 0,
        lambda c: c[0] == "sp2" and c[1] == 2,
        lambda c: c[0] == "sp2",
        lambda c: c[0] in ("sp4", "dp2xsp2") and c[1] in (1, 2) and c[2] in ("loss", "loss-div-sp") and c[3] == 0,
        lambda c: c[3] == 0,
        lambda c: True,
    ]
    seen, out = set(), []
    for ph in phases:
        group = [c for c in allc if ph(c) and c not in seen]
        seen.update(group)
        out.append(group)
    out.append([c for c in extra if c not in seen])
    return [g for g in out if g]


def run_once(cmd, out, log, timeout=None):
    """Run the command that writes trace set OUT, output to LOG, unless OUT.done says an earlier run finished
    it (a partial OUT is removed first); its exit status (0 when cached). OUT.done records the command."""
    done = pathlib.Path(str(out) + ".done")
    if pathlib.Path(rank_file(out, 0)).exists() and done.exists():
        return 0
    if out.exists():
        shutil.rmtree(out)
    with open(log, "w") as f:
        rc = subprocess.call([str(c) for c in cmd], stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    if rc == 0:
        done.write_text(" ".join(map(str, cmd)) + "\n")
    return rc
