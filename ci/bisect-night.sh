#!/usr/bin/env bash
# The nightly's bisect step (CPU rows): tonight's new failures of this runner against the
# latest night of it in the report's history, within a time budget. bisect.json is written
# beside the results (the report job shows it on the failures' cards); the overlays and the
# resumable state go to $NPU_REGRESS_BISECT_STATE where it is set, else to the bisect's
# default, .npu-regress-bisect/<runner>-<inputs digest> in the checkout (the nightly caches
# that folder, so that a rerun of a night's job resumes its bisect where the budget cut it),
# never into the uploaded results.
#   bash ci/bisect-night.sh RESULTS HISTORY OUT [BUDGET_SECONDS]
# The night's verdict is the suites step's: this step never turns it green or red. It fails
# only when the bisect itself crashed (exit 1: the harness's bug, ours); found (0), not
# found (2) and unusable inputs (3: a first night, no history yet) are said and pass.
set -uo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ $# -ge 3 ] || { echo "usage: bash ci/bisect-night.sh RESULTS HISTORY OUT [BUDGET_SECONDS]" >&2; exit 3; }
results=$1 history=$2 out=$3 budget=${4:-1800}
state=()
[ -n "${NPU_REGRESS_BISECT_STATE:-}" ] && state=(--state "$NPU_REGRESS_BISECT_STATE")
mkdir -p "$out"
status=0
"$PY" -m harness bisect "$results" --history "$history" --budget "$budget" \
  --out "$out/bisect.json" "${state[@]}" --quiet-when-nothing || status=$?
case $status in
  0|2) ;;
  3) echo "npu-regress bisect: not run (its reason above)" ;;
  *) echo "npu-regress bisect: crashed (exit $status): the harness's bug" >&2; exit "$status" ;;
esac
exit 0
