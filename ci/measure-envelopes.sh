#!/usr/bin/env bash
# Measure the envelopes of the rows that may differ: run their suites N times (default 5)
# the way the nightly runs them, then adopt the figures into the data files
# (npu-regress expectations update) and show the diff to review.
#   bash ci/measure-envelopes.sh [RUNS] [OUT]
# The main environment runs the TinyDecoder, transformers, training, rollout and collectives
# rows as ci/run-suites.sh does (no xdist on CPU: 2 torch threads a child); the engine venv
# (.venv-engine, bash ci/setup.sh --engine) runs the vLLM and serving rows one engine at a
# time with 2 torch threads, as tests/test_vllm_engine.py does. The two go side by side.
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${1:-5}
OUT=${2:-reports/envelopes}
PY=${PYTHON:-python3}
ENGINE=${NPU_REGRESS_ENGINE_VENV:-$PWD/.venv-engine}/bin/python
mkdir -p "$OUT"
pyt() { "$@" -p no:cacheprovider -q --device cpu; }
main_rows() {
  for i in $(seq 1 "$RUNS"); do
    pyt "$PY" -m pytest suites/test_logprob_batch_invariance.py suites/test_rl_consistency.py \
      suites/test_collectives.py -k "not vllm" --harness-results="$OUT/main-$i.jsonl" \
      > "$OUT/main-$i.log" 2>&1
    echo "main run $i: $(tail -n 1 "$OUT/main-$i.log")"
  done
}
engine_rows() {
  [ -x "$ENGINE" ] || { echo "no engine venv at $ENGINE: its rows are not measured"; return; }
  for i in $(seq 1 "$RUNS"); do
    OMP_NUM_THREADS=2 pyt "$ENGINE" -m pytest suites/test_logprob_batch_invariance.py \
      -k "vllm and not tp4" -n 0 --harness-results="$OUT/engine-$i.jsonl" \
      > "$OUT/engine-$i.log" 2>&1
    OMP_NUM_THREADS=2 pyt "$ENGINE" -m pytest suites/test_logprob_serving.py -n 0 \
      -k "not http" --harness-results="$OUT/serving-$i.jsonl" > "$OUT/serving-$i.log" 2>&1
    echo "engine run $i: $(tail -n 1 "$OUT/engine-$i.log"); $(tail -n 1 "$OUT/serving-$i.log")"
  done
}
main_rows & main_pid=$!
engine_rows
wait "$main_pid"
"$PY" -m harness expectations update "$OUT"/*.jsonl
