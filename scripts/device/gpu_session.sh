#!/usr/bin/env bash
# ONE command for the device machine (run there from the repository root; carry build/wheels, made here by
# scripts/device/prepare_wheels.sh). Stages, each optional and each bounded by `timeout`:
#   install  pip install --no-index the carried wheels into /tmp/site
#   tests    python3 -m pytest -m gpu TEST_PATHS (default: tests, without tests/operator)
#   hotpath  bench/kernels/hot_path.py (kernel timings; only with --hot-path or --hot-path-args, e.g. "--linear-only")
#   bench    ninfer-bench per --geometries (default 27B; BENCH_ARGS default: prefill 7680, decode C=1,8)
#            + bench/host_parking.py (unless --no-host-parking)
#   load     per profile, its own ninfer-serve --synthetic qwen3.6-27b (host parking on), then loadtest/run.py:
#            agent_sessions_long: 4 lanes, 4 sessions of ~--context tokens, device KV --kv-capacity (holds them all)
#            park_resume: --park-lanes lanes, --park-users sessions of ~--park-context tokens, device KV
#            --park-kv-capacity (smaller than their sum: sessions are evicted, parked to host RAM and restored)
# Logs and results go to $OUT after every stage (the few files that come back: a call cut off at its limit still
# returns what finished; the load runs' files in $OUT/load.tar.gz) and, whole, to $OUT/session.tar.gz at the end.
# Usage: scripts/device/gpu_session.sh [--no-tests] [--no-bench] [--no-engine-bench] [--load none|agent|park|both]
#        [--test-paths "P..."] [--hot-path] [--hot-path-args "ARGS"] [--geometries "G..."] [--bench-args "ARGS"] [--no-host-parking]
#        [--tests-timeout S] [--bench-timeout S] [--load-timeout S (per profile)] [--geometry G]
#        [--context N] [--users N] [--kv-capacity TOKENS] [--host-kv-mib N] [--max-context N]
#        [--park-users N] [--park-context N] [--park-lanes N] [--park-kv-capacity TOKENS]
# One call has 10 minutes: a server start (weights + warm-up compile) takes 1-2 minutes, so run one load profile
# per call (--load agent, then --load park), each with --no-tests --no-bench.
set -uo pipefail
cd "$(dirname "$0")/../.."
TESTS=1 BENCH=1 ENGINE_BENCH=1 LOAD=both HOT_PATH=0 HOT_PATH_ARGS="" HOST_PARKING=1
TEST_PATHS="tests --ignore tests/operator" GEOMETRIES=qwen3.6-27b
BENCH_ARGS="--prompt-len 7680 --concurrency 1,8 --decode-tokens 32"
TESTS_T=240 BENCH_T=240 LOAD_T=420
GEOMETRY=qwen3.6-27b CONTEXT=100000 USERS=4 KV_CAPACITY=524288 HOST_KV_MIB=49152 MAX_CONTEXT=131072 PORT=8080
PARK_USERS=8 PARK_CONTEXT=30000 PARK_LANES=2 PARK_KV_CAPACITY=131072
while (($#)); do
  case $1 in
    --no-tests) TESTS=0 ;; --no-bench) BENCH=0 ;; --no-engine-bench) ENGINE_BENCH=0 ;;
    --no-load) LOAD=none ;; --load) LOAD=$2; shift ;;
    --test-paths) TEST_PATHS=$2; shift ;; --hot-path) HOT_PATH=1 ;; --hot-path-args) HOT_PATH=1 HOT_PATH_ARGS=$2; shift ;; --no-host-parking) HOST_PARKING=0 ;;
    --geometries) GEOMETRIES=$2; shift ;; --bench-args) BENCH_ARGS=$2; shift ;;
    --tests-timeout) TESTS_T=$2; shift ;; --bench-timeout) BENCH_T=$2; shift ;; --load-timeout) LOAD_T=$2; shift ;;
    --geometry) GEOMETRY=$2; shift ;; --context) CONTEXT=$2; shift ;; --users) USERS=$2; shift ;;
    --kv-capacity) KV_CAPACITY=$2; shift ;; --host-kv-mib) HOST_KV_MIB=$2; shift ;;
    --max-context) MAX_CONTEXT=$2; shift ;;
    --park-users) PARK_USERS=$2; shift ;; --park-context) PARK_CONTEXT=$2; shift ;;
    --park-lanes) PARK_LANES=$2; shift ;; --park-kv-capacity) PARK_KV_CAPACITY=$2; shift ;;
    -h|--help) sed -n 2,22p "$0"; exit 0 ;;
    *) echo "gpu_session.sh: unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
OUT=${OUT:-$PWD/out}
WORK=/tmp/ninfer-session
rm -rf "$WORK"  # a warm machine keeps the last call's files: they would come back again as this call's
mkdir -p "$OUT" "$WORK"
export PYTHONUNBUFFERED=1
log() { echo "[gpu_session $(date +%T)] $*" | tee -a "$WORK/session.log"; }
status=0
# collect: copy what has come out so far into $OUT (at most 8 files come back), after every stage, so a call cut
# off at its limit still returns the stages that finished.
collect() {
  cp "$WORK/session.log" "$OUT/"
  for f in gpu_tests.log hot_path.json "$WORK"/bench_*.json; do
    f=${f##*/}; [[ -f $WORK/$f ]] && tail -c 2000000 "$WORK/$f" >"$OUT/$f"
  done
  compgen -G "$WORK/load/*/summary.json" >/dev/null && cat "$WORK"/load/*/summary.json >"$OUT/load_summaries.json"
  local logs; logs=$(ls "$WORK"/bench_*.log "$WORK"/hot_path.log 2>/dev/null)
  # shellcheck disable=SC2086
  [[ -n $logs ]] && cat $logs >"$OUT/bench_logs.txt"
  if [[ -d $WORK/load ]]; then  # (cd: the globs are relative to $WORK)
    (cd "$WORK" && tar -czf "$OUT/load.tar.gz" load ./*.jsonl ./stats_*.json ./serve_*.log 2>/dev/null)
  fi
  return 0
}
stage() {  # stage NAME SECONDS CMD...: run bounded, log to $WORK/NAME.log, record the exit status
  local name=$1 seconds=$2; shift 2
  log "$name: start (limit ${seconds}s): $*"
  timeout --kill-after=15 "$seconds" "$@" >"$WORK/$name.log" 2>&1
  local rc=$?
  log "$name: exit $rc$( ((rc == 124)) && echo ' (timed out)')"
  ((rc)) && status=1
  collect
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
# shellcheck disable=SC2086  # TEST_PATHS and BENCH_ARGS are word lists
((TESTS)) && stage gpu_tests "$TESTS_T" python3 -m pytest -m gpu $TEST_PATHS -q -p no:cacheprovider --timeout 150 --durations 20 -rfE
# shellcheck disable=SC2086
((HOT_PATH)) && stage hot_path "$BENCH_T" python3 bench/kernels/hot_path.py $HOT_PATH_ARGS --json "$WORK/hot_path.json"

# ---- bench ----
if ((BENCH)); then
  if ((ENGINE_BENCH)); then
    for g in $GEOMETRIES; do
      # shellcheck disable=SC2086
      stage "bench_$g" "$BENCH_T" python3 -m engine.testing.bench --synthetic "$g" $BENCH_ARGS --json "$WORK/bench_$g.json"
    done
  fi
  ((HOST_PARKING)) && stage host_parking "$((BENCH_T / 2))" python3 bench/host_parking.py --json "$WORK/host_parking.json"
fi

# ---- load ----
# serve_and_load PROFILE LANES KV_CAPACITY LOADTEST_ARGS...: a fresh server for one profile, bounded by LOAD_T.
serve_and_load() {
  local profile=$1 lanes=$2 capacity=$3; shift 3
  log "serve ($profile): --synthetic $GEOMETRY --max-context $MAX_CONTEXT --max-concurrency $lanes --kv-capacity $capacity --host-kv-cache-mib $HOST_KV_MIB"
  timeout --kill-after=15 "$LOAD_T" python3 -m api.serve --synthetic "$GEOMETRY" --port "$PORT" \
    --max-context "$MAX_CONTEXT" --max-concurrency "$lanes" --kv-capacity "$capacity" --pending-timeout-ms 900000 \
    --host-kv-cache-mib "$HOST_KV_MIB" --prefill-chunk 8192 --log-stats-interval-ms 10000 \
    --request-log-jsonl "$WORK/requests_$profile.jsonl" >"$WORK/serve_$profile.log" 2>&1 &
  local server=$! started=$SECONDS up=0
  while ((SECONDS - started < 300)) && kill -0 "$server" 2>/dev/null; do
    python3 -c "import httpx, sys; sys.exit(httpx.get('http://127.0.0.1:$PORT/health').status_code != 200)" \
      2>/dev/null && { up=1; break; }
    sleep 2
  done
  if ((up)); then
    log "serve ($profile): healthy after $((SECONDS - started))s"
    local left=$((LOAD_T - (SECONDS - started) - 30))
    stage "$profile" "$left" python3 loadtest/run.py "$profile" --scale gpu --host "http://127.0.0.1:$PORT" \
      --run-time "$((left - 60))s" --locust "$(command -v locust)" --results "$WORK/load/$profile" \
      --server-request-log "$WORK/requests_$profile.jsonl" "$@"
    python3 -c "import httpx; print(httpx.get('http://127.0.0.1:$PORT/stats').text)" >"$WORK/stats_$profile.json"
    collect
  else
    log "serve ($profile): not healthy (see serve_$profile.log)"; status=1
  fi
  kill -TERM "$server" 2>/dev/null; wait "$server" 2>/dev/null
}
if [[ $LOAD == agent || $LOAD == both ]]; then
  serve_and_load agent_sessions_long "$USERS" "$KV_CAPACITY" --users "$USERS" --param "context_tokens=$CONTEXT"
fi
if [[ $LOAD == park || $LOAD == both ]]; then
  serve_and_load park_resume "$PARK_LANES" "$PARK_KV_CAPACITY" --users "$PARK_USERS" \
    --param "context_tokens=$PARK_CONTEXT" --param "think_time_s=[10, 30]"
fi

# ---- results back ----
log "done, status $status"
collect
tar -czf "$OUT/session.tar.gz" -C "$WORK" . 2>/dev/null
cat "$WORK/session.log"
exit $status
