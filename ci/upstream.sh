#!/usr/bin/env bash
# Install the upstream set of ci/upstream.txt into the Python given as $1 (called by
# ci/setup.sh --upstream). Never replaces torch: wheels go in with --no-deps, and
# vllm-ascend, whose native build needs CANN, contributes its released Python sources: its
# sdist's vllm_ascend/ package (and its compatibility matrix, for the preflight) is unpacked
# under .upstream/ and put on sys.path by a .pth file, as an installed package would be (no
# entry points: vLLM does not load it as its platform); torch-npu, which cannot import
# without CANN, contributes its wheel's Python files and headers under .upstream/ (read,
# never imported). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
mapfile -t wanted < <(grep -vE '^[[:space:]]*(#|$)' ci/upstream.txt | sed 's/[[:space:]]*#.*//')
wheels=()
ascend=""
torch_npu=""
for req in "${wanted[@]}"; do
  case "$req" in
    vllm-ascend==*) ascend=${req#vllm-ascend==} ;;
    torch-npu==*) torch_npu=${req#torch-npu==} ;;
    *) wheels+=("$req") ;;
  esac
done
# What an image already has (an Ascend runner's real vllm, vllm-ascend, verl) is kept: the
# upstream set fills in what is missing, it never replaces a stack.
installed() {  # name -> its installed version, or nothing
  "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"
}
missing=()
for req in "${wheels[@]}"; do
  have=$(installed "${req%%==*}")
  if [ -n "$have" ] && [ "$have" != "${req#*==}" ]; then
    echo "npu-regress upstream: keeping installed ${req%%==*} $have (the set pins ${req#*==})"
  elif [ -z "$have" ]; then
    missing+=("$req")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-deps "${missing[@]}"
fi
if [ -n "$ascend" ] && [ -n "$(installed vllm-ascend)" ]; then
  echo "npu-regress upstream: keeping installed vllm-ascend $(installed vllm-ascend)"
  ascend=""
fi
if [ -n "$ascend" ]; then
  dest="$PWD/.upstream/vllm-ascend-$ascend"
  matrix=docs/source/community/versioning_policy.md  # its CANN per release (preflight)
  if [ ! -f "$dest/vllm_ascend/batch_invariant.py" ] || [ ! -f "$dest/$matrix" ]; then
    dl=$(mktemp -d)
    # The sdist's metadata step runs its setup.py: it needs setuptools_scm and wheel (the
    # [upstream] extra) and a SOC_VERSION, or it asks npu-smi for the chip.
    SOC_VERSION=${SOC_VERSION:-ascend910b1} "$PY" -m pip download -q --no-deps \
      --no-build-isolation --no-binary :all: -d "$dl" "vllm-ascend==$ascend"
    mkdir -p "$dest"
    tar -xzf "$dl"/vllm_ascend-"$ascend".tar.gz -C "$dl"
    rm -rf "$dest/vllm_ascend"
    cp -r "$dl/vllm_ascend-$ascend/vllm_ascend" "$dest/"
    mkdir -p "$dest/$(dirname "$matrix")"
    cp "$dl/vllm_ascend-$ascend/$matrix" "$dest/$matrix"
    rm -rf "$dl"
  fi
  site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  echo "$dest" > "$site/npu_regress_upstream.pth"
fi
# torch-npu: its files, not an install (importing it needs torch 2.14.0 and CANN). An image
# with a real torch_npu is read from there instead (harness.stack.upstream.torch_npu_file).
if [ -n "$torch_npu" ]; then
  dest="$PWD/.upstream/torch-npu-$torch_npu"
  if [ ! -f "$dest/torch_npu/include/torch_npu/csrc/core/npu/NpuVariables.h" ]; then
    dl=$(mktemp -d)
    "$PY" -m pip download -q --no-deps --only-binary :all: -d "$dl" "torch-npu==$torch_npu"
    rm -rf "$dest"
    mkdir -p "$dest"
    "$PY" - "$dl" "$dest" <<'PYEOF'
import pathlib, sys, zipfile
wheel = next(pathlib.Path(sys.argv[1]).glob("torch_npu-*.whl"))
with zipfile.ZipFile(wheel) as zf:
    zf.extractall(sys.argv[2], [n for n in zf.namelist()
                                if n.endswith((".py", ".h")) and n.startswith("torch_npu/")])
PYEOF
    rm -rf "$dl"
  fi
fi
"$PY" - <<'PYEOF'
import importlib.util
for name in ("vllm", "verl", "vllm_ascend"):
    spec = importlib.util.find_spec(name)
    print(f"npu-regress upstream: {name} -> {spec.submodule_search_locations[0] if spec else 'MISSING'}")
PYEOF
