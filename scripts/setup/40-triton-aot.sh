#!/usr/bin/env bash
# Triton for ahead-of-time kernel compilation (tests/kernels/test_aot_sm120.py, bench/kernels/aot_compile.py):
#   $NINFER_TOOLS/triton-venv   a venv of its own with triton (the device image's version) and numpy.
# The project's CPU venv (.venv) must never get triton (it breaks transformers on CPU), hence the separate
# venv. No torch: Triton's compiler only needs the kernel source, a signature and a GPUTarget; ptxas ships
# inside the triton wheel, so cubins for any target (sm_90, sm_120) are built here without a GPU or driver.
# Idempotent: with the venv in place and at the right version it only checks (well under a second).
set -euo pipefail
TOOLS=${NINFER_TOOLS:-$HOME/.cache/ninfer-tools}
VENV=$TOOLS/triton-venv
TRITON_VERSION=3.6.0  # what the device image runs (bench/results/*_h200_*.json)
PY=$VENV/bin/python

installed() {  # the installed triton's version, or nothing
  [ -x "$PY" ] && "$PY" - <<'PYEOF' 2>/dev/null
import importlib.metadata as m
print(m.version("triton"))
m.version("numpy")
PYEOF
}

if [ "$(installed || true)" != "$TRITON_VERSION" ]; then
  mkdir -p "$TOOLS"
  [ -x "$PY" ] || python3 -m venv "$VENV"
  "$PY" -m pip install --quiet --disable-pip-version-check "triton==$TRITON_VERSION" numpy
fi
[ "$(installed || true)" = "$TRITON_VERSION" ] || { echo "triton $TRITON_VERSION missing in $VENV" >&2; exit 1; }
echo "triton AOT tools ready: triton $TRITON_VERSION in $VENV"
