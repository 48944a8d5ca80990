#!/usr/bin/env bash
# What a runner (Ascend or CPU) executes: pytest suites/ on the detected device, with
# JUnit XML, the results file and the rendered report under $HARNESS_OUT.
#   HARNESS_OUT     output folder (default reports/latest)
#   HARNESS_RUNNER  runner name in the results (default: host name)
#   HARNESS_REQUIRE capabilities this runner must have (--harness-require; default none)
#   extra arguments go to pytest (e.g. -k switch)
# The job's exit status is pytest's; a failing report step never fails the job. pytest runs
# in its own session, and its whole process group is ended afterwards (TERM, then KILL):
# engine and HCCL workers outlive pytest and would keep holding NPU memory and ports.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
OUT=${HARNESS_OUT:-reports/latest}
RUNNER=${HARNESS_RUNNER:-$(hostname)}
mkdir -p "$OUT"

# One xdist worker per device (workers pin their children to device k mod N); none on CPU.
devices=$("$PY" -c 'from harness.stack.devices import detect; d = detect("auto"); print(d.kind, d.count)' \
  | tail -n 1) || devices="cpu 1"
read -r kind count <<<"$devices"
xdist=()
if [ "$kind" != "cpu" ] && [ "${count:-1}" -gt 1 ]; then
  xdist=(-n "$count")
fi
echo "npu-regress: runner=$RUNNER device=$kind x${count:-1} ${xdist[*]:-}"

require=()
if [ -n "${HARNESS_REQUIRE:-}" ]; then
  require=(--harness-require="$HARNESS_REQUIRE")
fi
setsid "$PY" -m pytest suites/ "${xdist[@]}" "${require[@]}" --junitxml="$OUT/junit.xml" \
  --harness-results="$OUT/results.jsonl" --harness-runner="$RUNNER" "$@" &
leader=$!
trap 'kill -TERM -- "-$leader" 2>/dev/null' INT TERM
wait "$leader"
rc=$?
if kill -0 "$leader" 2>/dev/null; then
  # a signal ended the wait, not pytest: it is writing its results footer and JUnit XML
  # (it handles SIGTERM like Ctrl-C); give it a minute before the group is killed
  ( sleep 60; kill -KILL -- "-$leader" 2>/dev/null ) &
  guard=$!
  wait "$leader"
  rc=$?
  kill "$guard" 2>/dev/null
fi
# End whatever the run left in its process group.
if kill -0 -- "-$leader" 2>/dev/null; then
  kill -TERM -- "-$leader" 2>/dev/null; sleep 5; kill -KILL -- "-$leader" 2>/dev/null
fi

# Report steps: never fail the job.
"$PY" -m harness report render "$OUT/results.jsonl" --out "$OUT/report" \
  || echo "npu-regress: report step failed (ignored)"
if [ -n "${GITHUB_STEP_SUMMARY:-}" ] && [ -f "$OUT/report/summary.md" ]; then
  cat "$OUT/report/summary.md" >> "$GITHUB_STEP_SUMMARY" || true
fi
exit "$rc"
