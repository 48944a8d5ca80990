#!/usr/bin/env bash
# Set up npu-regress on this machine, idempotently.
#   bash ci/setup.sh          what the suites need
#   bash ci/setup.sh --test   also what the harness's own tests need (linters, Chromium)
# torch: installed (2.13.0, a CPU wheel on plain machines) ONLY when none is importable;
# an existing torch is never replaced, because Ascend images ship torch and torch_npu as a
# matched pair and a CUDA/CPU wheel on top would break torch_npu.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "npu-regress setup: no importable torch; installing torch==2.13.0"
  "$PY" -m pip install -q "torch==2.13.0"
fi
if [ "${1:-}" = "--test" ]; then
  "$PY" -m pip install -q -e ".[test]"
  # The report's browser test needs Chromium; without it that one test skips, naming why.
  if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
      >/dev/null 2>&1 || echo "npu-regress setup: could not install chromium (browser test will skip)"
  fi
else
  "$PY" -m pip install -q -e .
fi
