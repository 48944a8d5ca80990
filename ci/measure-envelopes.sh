#!/usr/bin/env bash
# Measure the envelopes of the rows that may differ: run their suites N times (default 5)
# the way the nightly runs them, then adopt the figures into the data files
# (npu-regress expectations update) and show the diff to review.
#   bash ci/measure-envelopes.sh [RUNS] [OUT]
# An envelope is one runner identity's (harness.stack.identity: the CPU's kernel-choosing
# features and the torch threads), so each way a row runs here is measured N times: the main
# environment's TinyDecoder, transformers, training, rollout and collectives rows as
# ci/run-suites.sh runs them (no xdist on CPU: 2 torch threads a child) and as CI's tests do
# (-n 2: 1 thread a child); the engine venv (.venv-engine, bash ci/setup.sh --engine) runs
# the vLLM and serving rows one engine at a time with 2 torch threads, as
# tests/test_vllm_engine.py does. One after the other: side by side, their OpenMP threads
# oversubscribe the cores. The repeat rows are left out (they must be equal: nothing to
# measure).
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
OUT=${2:-reports/envelopes}
PY=${PYTHON:-python3}
ENGINE=${NPU_REGRESS_ENGINE_VENV:-$PWD/.venv-engine}/bin/python
mkdir -p "$OUT"
pyt() { "$@" -p no:cacheprovider -q --device cpu; }
for i in $(seq 1 "$RUNS"); do
  for n in 0 2; do
    pyt "$PY" -m pytest suites/test_logprob_batch_invariance.py suites/test_rl_consistency.py \
      suites/test_collectives.py -k "not vllm and not repeat" -n "$n" \
      --harness-results="$OUT/main-n$n-$i.jsonl" > "$OUT/main-n$n-$i.log" 2>&1
    echo "main run $i (-n $n): $(tail -n 1 "$OUT/main-n$n-$i.log")"
  done
  if [ -x "$ENGINE" ]; then
    OMP_NUM_THREADS=2 pyt "$ENGINE" -m pytest suites/test_logprob_batch_invariance.py \
      -k "vllm and not tp4 and not repeat" -n 0 --harness-results="$OUT/engine-$i.jsonl" \
      > "$OUT/engine-$i.log" 2>&1
    OMP_NUM_THREADS=2 pyt "$ENGINE" -m pytest suites/test_logprob_serving.py -n 0 \
      -k "not (http and bfloat16)" \
      --harness-results="$OUT/serving-$i.jsonl" > "$OUT/serving-$i.log" 2>&1
    echo "engine run $i: $(tail -n 1 "$OUT/engine-$i.log"); $(tail -n 1 "$OUT/serving-$i.log")"
  else
    echo "no engine venv at $ENGINE: its rows are not measured"
  fi
done
# this project's own tables (shipped in the package), from this checkout
"$PY" -m harness expectations update "$OUT"/*.jsonl --package-tables
