#!/usr/bin/env bash
# ONE device command: ninfer-bench on this tree and on a baseline tree (.baseline/, an older commit's engine, kernels,
# api, monitor: `git archive COMMIT engine kernels api monitor pyproject.toml | tar -x -C .baseline`, carried with
# the call), interleaved per geometry on the same GPU, so a restructure can show "the same figures within noise".
# Usage: scripts/device/bench_vs_baseline.sh "GEOMETRIES" "BENCH ARGS" PER_RUN_SECONDS
set -uo pipefail
cd "$(dirname "$0")/../.."
GEOMETRIES=${1:-"qwen3.6-27b qwen3.6-35b-a3b"}
ARGS=${2:-"--prompt-len 7680 --concurrency 1,8 --decode-tokens 32"}
LIMIT=${3:-150}
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site build/wheels/*.whl \
  >/dev/null 2>&1 || echo "wheel install failed"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
for g in $GEOMETRIES; do
  # shellcheck disable=SC2086
  (export PYTHONPATH=$PWD:/tmp/site; timeout "$LIMIT" python3 -m engine.testing.bench --synthetic "$g" $ARGS \
    --json "$OUT/bench_new_$g.json" >"$OUT/bench_new_$g.log" 2>&1; echo "new $g rc=$?")
  # shellcheck disable=SC2086
  (cd .baseline && export PYTHONPATH=$PWD:/tmp/site; timeout "$LIMIT" python3 -m engine.bench --synthetic "$g" $ARGS \
    --json "$OUT/bench_base_$g.json" >"$OUT/bench_base_$g.log" 2>&1; echo "base $g rc=$?")
done
for f in "$OUT"/bench_*.log; do echo "== ${f##*/}"; tail -12 "$f"; done
