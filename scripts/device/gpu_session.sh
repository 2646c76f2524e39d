#!/usr/bin/env bash
# ONE command for the device machine (run there from the repository root; carry build/wheels, made here by
# scripts/device/prepare_wheels.sh). Stages, each optional and each bounded by `timeout`:
#   install  pip install --no-index the carried wheels into /tmp/site
#   tests    python3 -m pytest -m gpu tests
#   bench    ninfer-bench (27B: prefill 7680, decode C=1,8) + bench/host_parking.py
#   load     ninfer-serve --synthetic qwen3.6-27b with host parking, then loadtest/run.py
#            agent_sessions_long (4 sessions, ~100k context) and park_resume
# Logs and results go to $OUT (the few files that come back) and, whole, to $OUT/session.tar.gz.
# Usage: scripts/device/gpu_session.sh [--no-tests] [--no-bench] [--no-load] [--tests-timeout S]
#        [--bench-timeout S] [--load-timeout S] [--geometry G] [--context N] [--users N] [--host-kv-mib N]
#        [--no-engine-bench] [--kv-capacity TOKENS] [--park-users N] [--park-context N]
# The server's device KV (--kv-capacity, default 524,288 tokens) holds agent_sessions_long's 4 x ~105k sessions
# but not park_resume's --park-users x ~--park-context ones, so park_resume evicts, parks and restores.
set -uo pipefail
cd "$(dirname "$0")/../.."
TESTS=1 BENCH=1 ENGINE_BENCH=1 LOAD=1 KV_CAPACITY=524288 PARK_USERS=12 PARK_CONTEXT=60000
TESTS_T=240 BENCH_T=240 LOAD_T=420
GEOMETRY=qwen3.6-27b CONTEXT=100000 USERS=4 HOST_KV_MIB=49152 MAX_CONTEXT=131072 PORT=8080
while (($#)); do
  case $1 in
    --no-tests) TESTS=0 ;; --no-bench) BENCH=0 ;; --no-load) LOAD=0 ;; --no-engine-bench) ENGINE_BENCH=0 ;;
    --kv-capacity) KV_CAPACITY=$2; shift ;; --park-users) PARK_USERS=$2; shift ;;
    --park-context) PARK_CONTEXT=$2; shift ;;
    --tests-timeout) TESTS_T=$2; shift ;; --bench-timeout) BENCH_T=$2; shift ;; --load-timeout) LOAD_T=$2; shift ;;
    --geometry) GEOMETRY=$2; shift ;; --context) CONTEXT=$2; shift ;; --users) USERS=$2; shift ;;
    --host-kv-mib) HOST_KV_MIB=$2; shift ;; --max-context) MAX_CONTEXT=$2; shift ;;
    -h|--help) sed -n 2,15p "$0"; exit 0 ;;
    *) echo "gpu_session.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$PWD/out}
WORK=/tmp/ninfer-session
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
log() { echo "[gpu_session $(date +%T)] $*" | tee -a "$WORK/session.log"; }
status=0
stage() {  # stage NAME SECONDS CMD...: run bounded, log to $WORK/NAME.log, record the exit status
  local name=$1 seconds=$2; shift 2
  log "$name: start (limit ${seconds}s): $*"
  timeout --kill-after=15 "$seconds" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc$( ((rc == 124)) && echo ' (timed out)')"
  ((rc)) && status=1
  return 0
}

# ---- install ----
if compgen -G "build/wheels/*.whl" >/dev/null; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
    build/wheels/*.whl >"$WORK/install.log" 2>&1 || { log "install failed (see install.log)"; status=1; }
else
  log "no build/wheels/*.whl: run scripts/device/prepare_wheels.sh here and carry build/wheels"
fi
export PYTHONPATH=/tmp/site:$PWD${PYTHONPATH:+:$PYTHONPATH}
export PATH=/tmp/site/bin:$PATH
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv; git log -1 --format=%H 2>/dev/null
  python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)'
  python3 -c 'import fla; print("fla", getattr(fla, "__version__", "?"))'; } >"$WORK/env.log" 2>&1

# ---- tests ----
((TESTS)) && stage gpu_tests "$TESTS_T" python3 -m pytest -m gpu tests -q -p no:cacheprovider --timeout 150 --durations 20 -rfE

# ---- bench ----
if ((BENCH)); then
  ((ENGINE_BENCH)) && stage bench "$BENCH_T" python3 -m engine.bench --synthetic "$GEOMETRY" --prompt-len 7680 --concurrency 1,8 \
    --decode-tokens 32 --json "$WORK/bench_${GEOMETRY}.json"
  stage host_parking "$((BENCH_T / 2))" python3 bench/host_parking.py --json "$WORK/host_parking.json"
fi

# ---- load ----
if ((LOAD)); then
  log "serve: --kv-capacity $KV_CAPACITY --synthetic $GEOMETRY --max-context $MAX_CONTEXT --max-concurrency $USERS --host-kv-cache-mib $HOST_KV_MIB"
  timeout --kill-after=15 "$LOAD_T" python3 -m api.serve --synthetic "$GEOMETRY" --port "$PORT" \
    --max-context "$MAX_CONTEXT" --max-concurrency "$USERS" --kv-capacity "$KV_CAPACITY" --pending-timeout-ms 900000 \
    --host-kv-cache-mib "$HOST_KV_MIB" --prefill-chunk 8192 --log-stats-interval-ms 10000 \
    --request-log-jsonl "$WORK/requests.jsonl" >"$WORK/serve.log" 2>&1 &
  server=$!
  started=$SECONDS up=0
  while ((SECONDS - started < 300)) && kill -0 "$server" 2>/dev/null; do
    python3 -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/health').status_code != 200)" \
      2>/dev/null && { up=1; break; }
    sleep 2
  done
  if ((up)); then
    log "serve: healthy after $((SECONDS - started))s"
    left=$((LOAD_T - (SECONDS - started) - 20))
    half=$((left / 2))
    stage agent_sessions_long "$half" python3 loadtest/run.py agent_sessions_long --scale gpu \
      --host "http://127.0.0.1:$PORT" --users "$USERS" --param "context_tokens=$CONTEXT" \
      --run-time "$((half - 60))s" --locust /tmp/site/bin/locust --results "$WORK/load/agent_sessions_long"
    left=$((LOAD_T - (SECONDS - started) - 20))
    stage park_resume "$left" python3 loadtest/run.py park_resume --scale gpu --host "http://127.0.0.1:$PORT" \
      --users "$PARK_USERS" --param "context_tokens=$PARK_CONTEXT" --param "think_time_s=[10, 30]" \
      --run-time "$((left - 60))s" --locust /tmp/site/bin/locust --results "$WORK/load/park_resume"
    python3 -c "import httpx; print(httpx.get('http://127.0.0.1:$PORT/stats').text)" >"$WORK/stats_end.json"
  else
    log "serve: not healthy (see serve.log)"; status=1
  fi
  kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null
fi

# ---- results back: at most 8 files come back from $OUT ----
log "done, status $status"
tar -czf "$OUT/session.tar.gz" -C "$WORK" . 2>/dev/null
cp "$WORK/session.log" "$OUT/"
for f in gpu_tests.log bench.log serve.log; do [[ -f $WORK/$f ]] && tail -c 2000000 "$WORK/$f" >"$OUT/$f"; done
cat "$WORK"/load/*/summary.json >"$OUT/load_summaries.json" 2>/dev/null
cat "$WORK/session.log"
exit $status
