#!/usr/bin/env bash
# A venv for running the `-m gpu` kernel tests on a CPU under Triton's interpreter (TRITON_INTERPRET=1):
#   $NINFER_TOOLS/interp-venv   triton (the device image's version) plus, through a .pth file, every package of the
#                               project's .venv (torch, the project itself, pytest...).
# The project's .venv must never get triton (transformers then routes Qwen3.5 linear attention to GPU-only kernels),
# hence a venv of its own. Not part of `make test` (the interpreter suite is long); `make test-interp` uses it.
# Usage: scripts/dev/interp-venv.sh PROJECT_VENV   (idempotent: a second run only checks)
set -euo pipefail
PROJECT_VENV=$(cd "${1:?usage: interp-venv.sh PROJECT_VENV}" && pwd)
TOOLS=${NINFER_TOOLS:-$HOME/.cache/ninfer-tools}
VENV=$TOOLS/interp-venv
TRITON_VERSION=3.6.0  # as scripts/setup/40-triton-aot.sh: what the device image runs
[ -x "$VENV/bin/python" ] || python3 -m venv "$VENV"
if ! "$VENV/bin/python" -c "import importlib.metadata as m, sys; sys.exit(m.version('triton') != '$TRITON_VERSION')" 2>/dev/null; then
  "$VENV/bin/python" -m pip install --quiet --disable-pip-version-check "triton==$TRITON_VERSION"
fi
site=$("$PROJECT_VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
own=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$site" >"$own/zz-ninfer-project-venv.pth"  # after triton's own packages: the project's torch and packages
"$VENV/bin/python" -c "import torch, triton; print('interpreter venv ready: triton', triton.__version__, 'torch', torch.__version__)"
