#!/usr/bin/env bash
# The benchmark on a GPU machine, in steps; each step is one `python3 -m benchmarks` command
# bounded with `timeout` and writes its own folder under OUT. Needs no network: the RAPIDS
# packages, prefect, tpchgen-cli and matplotlib must already be in that Python.
#
#   bash benchmarks/device-bench.sh SF OUT [STEP ...]
#
# Steps, in this order (default: all of them):
#   core           (a) (a-deferred) (h) (b) (c) of Q1, Q3 and Q5 interleaved, then (f)
#                  with OVERHEAD_CALLS calls per timer and its profile     -> OUT/core
#   peer           (g) with Prefect's default cache policy and with NO_CACHE,
#                  no engine session in the process                        -> OUT/peer
#   roundtrips     (d) host round trips                                    -> OUT/roundtrips
#   many-tasks     TASKS tiny gpu_tasks vs plain tasks per flow run, cpu backend,
#                  TASK_RUNS flow runs of each, and their profile          -> OUT/many-tasks
#   session-start  the session's start, ours vs cudf-polars'               -> OUT/session-start
#   spill          held results moved out of device memory and back, pinned vs host
#                  frame, SPILL_SIZES GB, and tee's device copy of SF's lineitem
#                  (python -m benchmarks.spill; not in the default steps)   -> OUT/spill
#   report         every OUT/*/results.json merged into OUT/results.json, results.md
#                  and chart.png; prints the summary tables last
# A run split over several commands or machines: copy each step folder under one OUT
# and run the report step there (it needs no GPU: PYTHON=.venv/bin/python works).
#
# Environment:
#   PYTHON       the interpreter (default python3)
#   RAPIDS_ENV   shell script sourced first to put that Python on PATH (optional)
#   DATA_DIR     TPC-H parquet; a scale factor already there is reused (default ./.data-cache/tpch)
#   RUNS         timed interleaved rounds per pipeline (default 10); START_RUNS session starts (5)
#   OVERHEAD_CALLS  (f) calls per timer (default 300); TASKS (200) and TASK_RUNS (5) for many-tasks
#   WARMUPS      untimed warm-up rounds before them (default 1)
#   PIPELINES    comma-separated subset (default all three); BACKEND (default spmd)
#   SPILL_SIZES  GB of the spill step's results (default 1,2,4,8); SPILL_RUNS its rounds (5)
#   STEP_TIMEOUT seconds per step (default 570); each step's --budget-s is 60 s less
set -uo pipefail
if [ $# -lt 2 ]; then
  sed -n '/^set -uo/q;2,$p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
fi
SF=$1
OUT=$(mkdir -p "$2" && cd "$2" && pwd)
shift 2
STEPS=("$@")
[ ${#STEPS[@]} -eq 0 ] && STEPS=(core peer roundtrips many-tasks session-start report)
cd "$(dirname "$0")/.."

if [ -n "${RAPIDS_ENV:-}" ]; then . "$RAPIDS_ENV"; fi
PY=${PYTHON:-python3}
DATA_DIR=${DATA_DIR:-$PWD/.data-cache/tpch}
RUNS=${RUNS:-10}
WARMUPS=${WARMUPS:-1}
START_RUNS=${START_RUNS:-5}
OVERHEAD_CALLS=${OVERHEAD_CALLS:-300}
TASKS=${TASKS:-200}
TASK_RUNS=${TASK_RUNS:-5}
BACKEND=${BACKEND:-spmd}
STEP_TIMEOUT=${STEP_TIMEOUT:-570}
SPILL_SIZES=${SPILL_SIZES:-1,2,4,8}
SPILL_RUNS=${SPILL_RUNS:-5}
BUDGET=$((STEP_TIMEOUT - 60))
PIPELINE_ARGS=()
[ -n "${PIPELINES:-}" ] && PIPELINE_ARGS=(--pipelines "$PIPELINES")
export PREFECT_HOME=${PREFECT_HOME:-$(mktemp -d)}
export PREFECT_SERVER_EPHEMERAL_STARTUP_TIMEOUT_SECONDS=180 PREFECT_SERVER_ANALYTICS_ENABLED=false
export PYTHONUNBUFFERED=1

measuring=0
for step in "${STEPS[@]}"; do [ "$step" != report ] && measuring=1; done
imports_here() {  # whether $PY imports prefect_cudf_polars from this checkout
  "$PY" -c "import os, sys, prefect_cudf_polars as p; sys.exit(not os.path.samefile(os.path.dirname(p.__file__), 'prefect_cudf_polars'))" 2>/dev/null
}
if [ $measuring = 1 ]; then
  # This checkout into that Python, without dependencies (no network needed).
  imports_here || "$PY" -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 \
    || { tail -20 "$OUT/install.log"; exit 1; }
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null | tee "$OUT/gpu.txt"
fi

rc=0
bench() {  # bench STEP ARGS...: one bounded command, its log and exit status under OUT/STEP
  local step=$1
  shift
  mkdir -p "$OUT/$step"
  local started=$SECONDS
  echo "== $step: python -m benchmarks $*" | tee "$OUT/$step/command.txt"
  timeout "$STEP_TIMEOUT" "$PY" -m benchmarks "$@" --out "$OUT/$step" --backend "$BACKEND" \
    --budget-s "$BUDGET" >"$OUT/$step/log.txt" 2>&1
  local status=$?
  echo "== $step: exit $status after $((SECONDS - started)) s (log: $OUT/$step/log.txt)"
  [ $status -ne 0 ] && { tail -15 "$OUT/$step/log.txt"; rc=1; }
  return 0
}

VARIANT_ARGS=(--scale-factors "$SF" --runs "$RUNS" --warmups "$WARMUPS" --data-dir "$DATA_DIR" "${PIPELINE_ARGS[@]}")
for step in "${STEPS[@]}"; do
  case $step in
    core) bench core "${VARIANT_ARGS[@]}" --variants a,a-deferred,h,b,c,f --overhead-calls "$OVERHEAD_CALLS" --profile ;;
    peer) bench peer "${VARIANT_ARGS[@]}" --variants g ;;
    roundtrips) bench roundtrips "${VARIANT_ARGS[@]}" --variants d ;;
    many-tasks) bench many-tasks --many-tasks --tasks "$TASKS" --runs "$TASK_RUNS" --profile ;;
    session-start) bench session-start --session-start --runs "$START_RUNS" ;;
    spill)  # its own module: held results out of device memory and back by both routes, tee's device copies
      mkdir -p "$OUT/spill"
      lineitem="$DATA_DIR/sf$SF/lineitem.parquet"
      [ -f "$lineitem" ] || lineitem=""
      echo "== spill: python -m benchmarks.spill --sizes $SPILL_SIZES --runs $SPILL_RUNS ${lineitem:+--lineitem $lineitem}" \
        | tee "$OUT/spill/command.txt"
      timeout "$STEP_TIMEOUT" "$PY" -m benchmarks.spill --sizes "$SPILL_SIZES" --runs "$SPILL_RUNS" \
        ${lineitem:+--lineitem "$lineitem"} --out "$OUT/spill" >"$OUT/spill/log.txt" 2>&1 \
        || { tail -15 "$OUT/spill/log.txt"; rc=1; }
      cat "$OUT/spill/spill.md" 2>/dev/null
      ;;
    report)
      parts=()
      for dir in "$OUT"/*/; do [ -f "$dir/results.json" ] && parts+=("${dir%/}"); done
      if [ ${#parts[@]} -eq 0 ]; then
        echo "== report: no OUT/*/results.json in $OUT"
        rc=1
      else
        "$PY" -m benchmarks --merge "${parts[@]}" --out "$OUT" || rc=1
      fi
      ;;
    *) echo "unknown step $step (core, peer, roundtrips, many-tasks, session-start, spill, report)"; exit 2 ;;
  esac
done
exit $rc
