#!/usr/bin/env bash
# ONE device command that runs a plan: a text file of stages, one per line, `NAME SECONDS COMMAND...` (blank lines
# and `#` lines skipped). Run there from the repository root with build/wheels carried (see gpu_session.sh for the
# install). Each stage runs bounded by min(SECONDS, what is left of --budget), its stdout+stderr in $WORK/NAME.log;
# a stage that would get under 20 seconds is skipped and logged as such. Stages write their results under $WORK.
# After every stage $OUT/results.tgz holds $WORK (the device returns at most 8 files), so a call cut off at its
# limit still returns the stages before it. Triton's cache lives in .tcache/ (carry it to reuse the last call's
# compiles) or carry .carry/tcache.tgz (a call's $OUT/tcache.tgz, under 16 MB: it is unpacked into .tcache/).
# Usage: git rev-parse HEAD > .carry/commit; then on the device:
#   scripts/device/stages.sh PLAN_FILE[:STAGE,STAGE...] [PLAN_FILE[:...] ...] [--budget SECONDS (default 570)]
#   scripts/device/stages.sh --order scripts/device/plans/DATE-sN-ORDER.md CALL   (that file's CALL-th call line)
# Several plans run in the order given, each whole or only the named stages (a session's ORDER file composes its
# calls this way; tests/engine/test_device_plans.py checks the names and the budget).
# Before spending device time: tests/engine/test_device_plans.py checks the newest session's plans on the CPU (flags,
# env switches, pytest selections, outputs under $WORK).
set -uo pipefail
cd "$(dirname "$0")/../.."
BUDGET=570 PLANS=()
# --order ORDER_FILE N: run the N-th `scripts/device/stages.sh ...` line of a session's ORDER file (its call N)
if [[ ${1:-} == --order ]]; then
  line=$(grep -E '^[[:space:]]*scripts/device/stages\.sh ' "${2:?--order needs ORDER_FILE N}" | sed -n "${3:?--order needs N}p")
  [[ -n $line ]] || { echo "stages.sh: $2 has no call $3" >&2; exit 2; }
  shift 3
  set -- ${line#*stages.sh} "$@"
fi
while (($#)); do
  case $1 in
    --budget) BUDGET=${2:?--budget needs seconds}; shift 2 ;;
    *) PLANS+=("$1"); shift ;;
  esac
done
((${#PLANS[@]})) || { echo "usage: stages.sh PLAN_FILE[:STAGE,...] ... [--budget SECONDS]" >&2; exit 2; }
# the stage lines to run: each plan's, or only the named ones (an unknown name is an error before anything runs)
STAGES=$(mktemp)
for spec in "${PLANS[@]}"; do
  file=${spec%%:*} names=
  [[ $spec == *:* ]] && names=${spec#*:}
  [[ -f $file ]] || { echo "stages.sh: no plan $file" >&2; exit 2; }
  if [[ -z $names ]]; then
    grep -v '^[[:space:]]*\(#\|$\)' "$file" >>"$STAGES"
  else
    for n in ${names//,/ }; do
      grep -E "^$n[[:space:]]" "$file" >>"$STAGES" || { echo "stages.sh: $file has no stage $n" >&2; exit 2; }
    done
  fi
done
PLAN="${PLANS[*]}"
OUT=${OUT:-$PWD/out} WORK=/tmp/ninfer-stages
rm -rf "$WORK"; mkdir -p "$OUT" "$WORK" .tcache
export OUT WORK PYTHONUNBUFFERED=1 TRITON_CACHE_DIR=$PWD/.tcache
[[ -f .carry/tcache.tgz ]] && tar -xzf .carry/tcache.tgz -C .tcache
# the commit measured: .carry/commit, written here before the call (the device's copy of .git can answer
# `git rev-parse HEAD` with an older commit); the benches record NINFER_COMMIT
[[ -f .carry/commit ]] && export NINFER_COMMIT=$(cat .carry/commit)
log() { echo "[stages $(date +%T) +${SECONDS}s] $*" | tee -a "$OUT/stages.log"; }
if compgen -G "build/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    build/wheels/*.whl >"$WORK/install.log" 2>&1 || log "install failed (see install.log)"
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH} PATH=/tmp/site/bin:$PATH
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'; } >>"$OUT/stages.log" 2>&1
log "installed; plan $PLAN, budget ${BUDGET}s"
status=0
while read -r name seconds cmd; do
  [[ -z $name || $name == "#"* ]] && continue
  left=$((BUDGET - SECONDS - 5))
  ((seconds > left)) && seconds=$left
  if ((seconds < 20)); then log "$name: skipped (${left}s left)"; status=1; continue; fi
  log "$name: start (limit ${seconds}s): $cmd"
  timeout --kill-after=10 "$seconds" bash -c "$cmd" >"$WORK/$name.log" 2>&1 </dev/null
  rc=$?
  log "$name: exit $rc$( ((rc == 124)) && echo ' (timed out)')"
  ((rc)) && status=1
  tar -czf "$OUT/results.tgz" -C "$WORK" .
done <"$STAGES"
log "done, status $status"
tar -czf "$OUT/tcache.tgz" -C .tcache . && (($(stat -c %s "$OUT/tcache.tgz") < 16000000)) || rm -f "$OUT/tcache.tgz"
for f in "$WORK"/*.log; do echo "== ${f##*/}"; tail -n 12 "$f"; done
exit $status
