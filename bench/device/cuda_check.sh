#!/usr/bin/env bash
# The suites on a CUDA GPU, in one call (issue 48): isolation on the device, the switch
# suite's reference and vLLM targets, and the logprob suite's TinyDecoder and Hugging Face
# sources (fp32 and bf16, switch on and off); the results file, the JUnit XML and the
# rendered report go to OUT.
#   bash bench/device/cuda_check.sh OUT          on a machine with a CUDA device and the
#                                                packages it has (python3, torch, pytest)
#   bash bench/device/cuda_check.sh --dry OUT    without a device (CI): names each part that
#                                                needs one, and runs the rest: the setup, the
#                                                isolation file (its tests skip, naming why),
#                                                the selections (collected, not run), the report
# What the machine lacks comes from the tree: bench/device/wheels/*.whl (pytest-forked,
# defusedxml: bench/device/fetch.sh downloads them) and bench/device/vllm-sources.tgz
# (vLLM 0.23.0's Python files, no compiled extension: as the default profile installs them).
# Both are ignored by git; the device tool carries them.
set -uo pipefail
cd "$(dirname "$0")/../.."
dry=0
if [ "${1:-}" = "--dry" ]; then dry=1; shift; fi
OUT=${1:?usage: cuda_check.sh [--dry] OUT}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
site=$(mktemp -d "${TMPDIR:-/tmp}/npu-regress-site.XXXXXX")
start=$(date +%s)
say() { echo "npu-regress device: $*" | tee -a "$OUT/summary.txt"; }

# --- setup: what the machine lacks, beside its own packages (never replacing torch) -------
if compgen -G "bench/device/wheels/*.whl" >/dev/null; then
  "$PY" -m pip install -q --no-index --no-deps --no-compile --target "$site" bench/device/wheels/*.whl \
    && say "installed $(ls bench/device/wheels | tr '\n' ' ')"
fi
if [ -f bench/device/vllm-sources.tgz ]; then
  tar -xzf bench/device/vllm-sources.tgz -C "$site" && say "vLLM sources unpacked (no vllm._C)"
fi
export PYTHONPATH="$PWD:$site${PYTHONPATH:+:$PYTHONPATH}"
"$PY" - <<'PYEOF' | tee -a "$OUT/summary.txt"
import importlib, importlib.metadata as md, platform
import torch
print(f"npu-regress device: Python {platform.python_version()}, torch {torch.__version__}, "
      f"CUDA {torch.version.cuda}, device {torch.cuda.get_device_name(0) if torch.cuda.is_available() else 'none'}")
for dist in ("pytest", "pytest-xdist", "pytest-forked", "transformers", "triton", "defusedxml"):
    try:
        print(f"npu-regress device:   {dist} {md.version(dist)}")
    except md.PackageNotFoundError:
        print(f"npu-regress device:   {dist} absent")
for module in ("vllm", "vllm.envs", "vllm.model_executor.layers.batch_invariant"):
    try:
        importlib.import_module(module)
        print(f"npu-regress device:   import {module}: ok")
    except BaseException as exc:  # noqa: BLE001 - what imports and what not is the finding
        print(f"npu-regress device:   import {module}: {type(exc).__name__}: {str(exc)[:160]}")
PYEOF

cuda=$("$PY" -c 'import torch; print(int(torch.cuda.is_available()))' 2>/dev/null || echo 0)
if [ "$dry" = 0 ] && [ "$cuda" != 1 ]; then
  say "no CUDA device here: run with --dry, or on the device machine"; exit 2
fi
NEEDS_DEVICE="isolation on CUDA (bench/device/test_cuda_isolation.py); the switch suite's reference and vllm targets on CUDA; the logprob suite's tiny and hf sources on CUDA"
SWITCH_K="reference or vllm"
LOGPROB_K="(tiny or hf) and not vllm"
# the plugin by its entry point where this package is installed, else by name
plugin=(-p harness.plugin)
"$PY" -c 'import importlib.metadata as md, sys; sys.exit(0 if any(e.name == "npu_regress" for e in md.entry_points(group="pytest11")) else 1)' && plugin=()
args=("${plugin[@]}" -p no:cacheprovider -o "xfail_strict=true" -q -rA
      --junitxml="$OUT/junit.xml" --harness-results="$OUT/results.jsonl"
      --harness-runner="${HARNESS_RUNNER:-cuda-$(hostname)}")
if [ "$dry" = 1 ]; then
  say "dry mode (no device): these parts need one and are not run: $NEEDS_DEVICE"
  "$PY" -m pytest bench/device/test_cuda_isolation.py "${args[@]}" --device cpu \
    2>&1 | tail -n 15 | tee "$OUT/pytest.txt"
  rc=${PIPESTATUS[0]}
  for part in "suites/test_batch_invariant_switch.py|$SWITCH_K" "suites/test_logprob_batch_invariance.py|$LOGPROB_K"; do
    file=${part%%|*} k=${part#*|}
    n=$("$PY" -m pytest "$file" "${plugin[@]}" -p no:cacheprovider --collect-only -q --device cpu -k "$k" 2>/dev/null | grep -c '::')
    say "would run $n cases of $file -k '$k' on CUDA"
    [ "$n" -gt 0 ] || { say "the selection of $file is empty"; rc=1; }
  done
else
  workers=${NPU_REGRESS_DEVICE_WORKERS:-8}
  timeout "${NPU_REGRESS_DEVICE_BUDGET:-420}" "$PY" -m pytest bench/device/test_cuda_isolation.py \
    suites/test_batch_invariant_switch.py suites/test_logprob_batch_invariance.py \
    -k "test_cuda_isolation or (($SWITCH_K) and switch) or (($LOGPROB_K) and logprob)" \
    "${args[@]}" --device cuda -n "$workers" 2>&1 | tee "$OUT/pytest.txt" | tail -n 40
  rc=${PIPESTATUS[0]}
  [ "$rc" = 124 ] && say "the run reached its time budget: the results file says what finished"
fi
"$PY" -m harness report render "$OUT/results.jsonl" --out "$OUT/report" >/dev/null 2>&1 \
  || say "report step failed (the results file and JUnit XML are there)"
say "exit $rc after $(( $(date +%s) - start )) s"
rm -rf "$site"
exit "$rc"
