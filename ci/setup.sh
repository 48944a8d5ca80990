#!/usr/bin/env bash
# Set up npu-regress on this machine, idempotently.
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
"$PY" -m pip install -q -e ".[test]"
