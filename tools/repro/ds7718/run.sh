#!/bin/bash
# One run of the #7718/#7749 reproduction: run.sh RELEASE CONFIG [train_hf_zero2.py options...]
#   RELEASE  a DeepSpeed release; its interpreter is $ENV_ROOT/ds-RELEASE/bin/python (the layout
#            gradtrace-deepspeed-versions builds), or .venv/bin/python for the installed release
#   CONFIG   a config name in this directory (zero2_bf16_overlap, ...)
# Writes $RUNS/RELEASE/CONFIG/ (traces + summary.json) and $RUNS/RELEASE/CONFIG.log.
# Run from the repository root; gradtrace comes from $GRADTRACE_BUILD_DIR/python (default build/).
set -u
V=$1; C=$2; shift 2
ENV_ROOT=${ENV_ROOT:-$HOME/.cache/gradtrace/deepspeed-envs}
RUNS=${RUNS:-runs/ds7718}
BUILD=${GRADTRACE_BUILD_DIR:-build}
PY=.venv/bin/python
if [ "$($PY -c 'import deepspeed; print(deepspeed.__version__)' 2>/dev/null | tail -1)" != "$V" ]; then
  PY=$ENV_ROOT/ds-$V/bin/python
fi
[ -x "$PY" ] || { echo "run.sh: no interpreter for deepspeed $V ($PY)" >&2; exit 2; }
O=$RUNS/$V/$C
rm -rf "$O"; mkdir -p "$O"
DS_ACCELERATOR=cpu HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 GRADTRACE_RUN_ID="ds7718-$V-$C" PYTHONPATH="$BUILD/python" \
  nice -n 10 "$PY" tools/repro/ds7718/train_hf_zero2.py --config "tools/repro/ds7718/$C.json" --out "$O" "$@" \
  > "$O.log" 2>&1
rc=$?
echo "$V $C rc=$rc"
exit $rc
