#!/usr/bin/env bash
# The plugin's own tests (isolation, --isolate-all, reports, pytest's internals) on the
# pytest, pytest-xdist, pytest-forked and Python versions the declared ranges allow, each
# combination in a fresh venv of its own (under $NPU_REGRESS_COMPAT_DIR, default
# /tmp/npu-regress-compat).
#   bash ci/compat.sh ci      what .ci/run runs: the oldest of every range on Python 3.10
#                             and the newest on Python 3.11, and the wheel as a user's
#                             image installs it (ci/wheel-smoke.sh) beside them (about
#                             2.5 min here)
#   bash ci/compat.sh all     every row of MATRIX below (the nightly workflow)
#   bash ci/compat.sh ROW     one row, by its name (e.g. py312-pytest9.2)
# torch: only on Python 3.11 (the one torch wheel this kind of machine installs, a CPU
# build); on 3.10 and 3.12 the tests that need torch skip, naming why (tests/conftest.py).
set -euo pipefail
cd "$(dirname "$0")/.."

# name            python  pytest  pytest-xdist  pytest-forked
MATRIX="
py310-oldest      3.10    8.0.2   3.5.0         1.6.0
py311-pytest8.4   3.11    8.4.2   3.5.0         1.6.0
py311-pytest9.0   3.11    9.0.3   3.8.0         1.7.5
py311-newest      3.11    9.2.0   3.8.0         1.7.5
py312-pytest9.1   3.12    9.1.1   3.8.0         1.7.5
py312-newest      3.12    9.2.0   3.8.0         1.7.5
"
#: the package built and installed as a wheel (ci/wheel-smoke.sh): a row of its own, run in
#: the same pool (it is mostly pip and unpacking: after the two CI rows, one by one, it added
#: 47 s; beside them, nothing measurable)
WHEEL_ROW=wheel
CI_ROWS="py310-oldest py311-newest $WHEEL_ROW"
TESTS="tests/test_pytest_private.py tests/test_isolation.py tests/test_whole_test.py
  tests/test_isolate_all_dropin.py tests/test_forkserver.py tests/test_containment.py
  tests/test_peers.py tests/test_plugin.py tests/test_report.py tests/test_report_verdicts.py
  tests/test_robust_counting.py"
ROOT=${NPU_REGRESS_COMPAT_DIR:-/tmp/npu-regress-compat}

interpreter() {  # a python of version $1 that runs: pyenv's, else on PATH (a pyenv shim
  # for a version that is not selected is on PATH but fails)
  local found candidate
  for candidate in $(ls -d "${PYENV_ROOT:-$HOME/.pyenv}"/versions/"$1".*/bin/python 2>/dev/null) \
                   $(command -v "python$1" 2>/dev/null); do
    if "$candidate" -c "import sys; sys.exit(sys.version_info[:2] != tuple(map(int, '$1'.split('.'))))" \
        >/dev/null 2>&1; then
      found=$candidate
      break
    fi
  done
  [ -n "${found:-}" ] || { echo "ci/compat.sh: no Python $1 on this machine (pyenv or python$1)" >&2; return 1; }
  echo "$found"
}

run_row() {
  local name=$1 py=$2 pytest=$3 xdist=$4 forked=$5
  local venv="$ROOT/$name" python start
  python=$(interpreter "$py") || return 1
  start=$(date +%s)
  rm -rf "$venv"
  "$python" -m venv "$venv"
  # the lock's versions for everything else; the three plugins (and tomli, 3.10 only) as
  # the row says; jsonschema, because the report's tests check each line they write against
  # the results contract
  grep -v -E '^(pytest|pytest-xdist|pytest-forked|tomli)==' ci/constraints.txt > "$venv/constraints.txt"
  # the lock's rpds-py (jsonschema's) has no build for 3.10: pip picks the newest that has
  [ "$py" = 3.10 ] && sed -i '/^rpds-py==/d' "$venv/constraints.txt"
  local torch=()
  [ "$py" = 3.11 ] && torch=(torch==2.13.0)
  "$venv/bin/python" -m pip install -q -c "$venv/constraints.txt" "${torch[@]}" \
    "pytest==$pytest" "pytest-xdist==$xdist" "pytest-forked==$forked" jsonschema -e . \
    || { echo "ci/compat.sh: $name: install failed" >&2; return 1; }
  echo "npu-regress compat: $name: Python $("$venv/bin/python" -c 'import platform; print(platform.python_version())'), pytest $pytest, pytest-xdist $xdist, pytest-forked $forked, torch ${torch[*]:-absent} (setup $(( $(date +%s) - start )) s)"
  # shellcheck disable=SC2086 - TESTS is a word list
  "$venv/bin/python" -m pytest $TESTS -n 2 -p no:cacheprovider -q -p no:randomly
}

which=${1:-ci}
case "$which" in
  ci) rows=$CI_ROWS ;;
  all) rows=$(echo "$MATRIX" | awk 'NF {print $1}') ;;
  *) rows=$which ;;
esac
for row in $rows; do
  [ "$row" = "$WHEEL_ROW" ] && continue
  echo "$MATRIX" | awk -v n="$row" '$1 == n' | grep -q . \
    || { echo "ci/compat.sh: no row '$row' (rows: $(echo "$MATRIX" | awk 'NF {printf "%s ", $1}')$WHEEL_ROW)" >&2; exit 2; }
done
# Rows two at a time (NPU_REGRESS_COMPAT_JOBS, default 2): a row's venv install and its
# isolation tests' waits leave the 2 cores 40% idle when rows run one after another
# (measured: 207 s wall, 246 s of CPU for the two CI rows). Each row's output is shown
# whole when it ends, under its name.
jobs=${NPU_REGRESS_COMPAT_JOBS:-2}
logs=$(mktemp -d)
pids=() names=()
failed=()
reap() {  # wait for the oldest running row, show its output, note a failure
  local pid=${pids[0]} name=${names[0]} status=0
  wait "$pid" || status=$?
  sed "s/^/[$name] /" "$logs/$name.log"
  [ "$status" = 0 ] || failed+=("$name")
  pids=("${pids[@]:1}") names=("${names[@]:1}")
}
trap 'for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done; rm -rf "$logs"' EXIT
for row in $rows; do
  if [ "$row" = "$WHEEL_ROW" ]; then
    bash ci/wheel-smoke.sh > "$logs/$row.log" 2>&1 &
  else
    line=$(echo "$MATRIX" | awk -v n="$row" '$1 == n')
    # shellcheck disable=SC2086 - the row's words are its arguments
    ( run_row $line ) > "$logs/$row.log" 2>&1 &
  fi
  pids+=($!) names+=("$row")
  [ ${#pids[@]} -lt "$jobs" ] || reap
done
while [ ${#pids[@]} -gt 0 ]; do reap; done
if [ ${#failed[@]} -gt 0 ]; then
  echo "npu-regress compat: FAILED on ${failed[*]}" >&2
  exit 1
fi
echo "npu-regress compat: passed on $rows"
