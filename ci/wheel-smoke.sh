#!/usr/bin/env bash
# The package as a user's image installs it: build the wheel, install it (not editable) in a
# fresh venv with torch and the declared dependencies only, and run the switch suite's
# contract, the ledger and the pairing preflight from it, outside this checkout. Then the
# same suites with this checkout's harness first on sys.path: the outcomes must be the same
# test for test (a data file missing from the wheel shows up as a difference, or an error).
#   bash ci/wheel-smoke.sh        (about 1.5 min here; .ci/run runs it)
set -euo pipefail
cd "$(dirname "$0")/.."
CHECKOUT=$PWD
PY=${PYTHON:-python3}
work=$(mktemp -d "${TMPDIR:-/tmp}/npu-regress-wheel.XXXXXX")
trap 'rm -rf "$work"' EXIT

# from a copy of the tree as git sees it (tracked and new files, nothing ignored): a
# setup's egg-info in the checkout would hand setuptools its file list and hide a data file
# the package declaration leaves out
mkdir -p "$work/src"
git ls-files -z -co --exclude-standard | xargs -0 cp --parents -t "$work/src"
"$PY" -m pip wheel -q --no-deps -w "$work/dist" "$work/src" >/dev/null
wheel=$(ls "$work"/dist/npu_regress-*.whl)
echo "npu-regress wheel: $(basename "$wheel"): $(unzip -l "$wheel" | grep -c -E '\.(toml|j2|css|js)$') data files"
"$PY" -m venv "$work/venv"
# torch as setup installs it on a machine without one; the rest as the wheel declares it
"$work/venv/bin/python" -m pip install -q -c ci/constraints.txt torch==2.13.0 "$wheel"

# the suites and the ini they run under, without the harness's sources beside them
mkdir -p "$work/run"
cp -r suites "$work/run/suites"
cp pyproject.toml "$work/run/pyproject.toml"
cd "$work/run"
where=$("$work/venv/bin/python" -c 'import harness, os; print(os.path.dirname(harness.__file__))')
case "$where" in
  "$work"/venv/*) echo "npu-regress wheel: harness imported from $where" ;;
  *) echo "ci/wheel-smoke.sh: harness was imported from $where, not the wheel" >&2; exit 1 ;;
esac
"$work/venv/bin/python" - <<'PYEOF'
from harness.invariance import declared
from harness.plugin.verdicts import load_ledger
from harness.stack import pairing

contract = declared.load("vllm_ascend", "0.23.0.post1")
assert contract.ops, "the switch contract (declared.toml) declares no ops for vllm-ascend"
print(f"npu-regress wheel: switch contract {len(contract.ops)} vllm-ascend ops, ledger "
      f"{len(load_ledger())} findings, pairing matrix {len(pairing.table())} releases")
PYEOF

SUITES=(suites/test_batch_invariant_switch.py suites/test_stack_preflight.py)
outcomes() {  # nodeid outcome, one per line, sorted
  "$@" -m pytest "${SUITES[@]}" -p no:cacheprovider -q -rA --harness-results= 2>&1 \
    | grep -E '^(PASSED|FAILED|ERROR|SKIPPED|XFAIL|XPASS) ' | sed -E 's/ - .*//' | sort
}
outcomes "$work/venv/bin/python" > "$work/wheel.txt"
PYTHONPATH="$CHECKOUT" outcomes "$work/venv/bin/python" > "$work/checkout.txt"
echo "npu-regress wheel: $(wc -l < "$work/wheel.txt") outcomes from the wheel: $(cut -d' ' -f1 "$work/wheel.txt" | sort | uniq -c | tr -s ' ' | tr '\n' ',')"
if [ ! -s "$work/wheel.txt" ] || grep -q '^ERROR' "$work/wheel.txt"; then
  echo "ci/wheel-smoke.sh: the suites did not run from the wheel" >&2
  cat "$work/wheel.txt" >&2
  exit 1
fi
if ! diff "$work/checkout.txt" "$work/wheel.txt"; then
  echo "ci/wheel-smoke.sh: the wheel's outcomes differ from the checkout's (diff above: < checkout, > wheel)" >&2
  exit 1
fi
echo "npu-regress wheel: the same outcomes as from the checkout"
