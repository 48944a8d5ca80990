#!/usr/bin/env bash
# Install a stack profile (ci/profiles/NAME.toml; default: default) into the Python given as
# $1 (called by ci/setup.sh --upstream / --profile NAME). Never replaces torch: the
# profile's wheels go in with --no-deps, then everything they declare (their Requires-Dist;
# vllm-ascend's requirements.txt) but what the profile lists under [not_installed] with a
# reason, under the profile's lock with torch held at the installed version; then every
# declared requirement is verified (a missing or out-of-range package stops setup, named).
# vllm-ascend, whose native build needs CANN, contributes its released Python sources: its
# sdist's vllm_ascend/ package, its compatibility matrix and requirements.txt are unpacked
# under .upstream/ and put on sys.path by a .pth file, and the build-time file its setup.py
# writes (vllm_ascend/_build_info.py, for $SOC_VERSION, default ascend910b1) is written by
# that setup.py's own gen_build_info(). torch-npu contributes its wheel's Python files and
# headers under .upstream/ (read, never imported). SGLang contributes its wheel's Python
# sources under .upstream/ (on the same .pth): its PyPI wheel declares the CUDA target's
# requirements (torch==2.14.1, flashinfer...), while Ascend installs it from its source tree
# (docs.sglang.io, Ascend NPUs: pyproject_npu.toml, triton-ascend). Idempotent.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-python3}
PROFILE=${2:-default}
profile() { "$PY" -m harness.stack.profile "$@" "$PROFILE"; }
mapfile -t wheels < <(profile get wheels)
mapfile -t sources < <(profile get sources)
lock=$(profile get lock)
ascend="" torch_npu="" sglang=""
for req in "${sources[@]}"; do
  case "$req" in
    vllm-ascend==*) ascend=${req#vllm-ascend==} ;;
    torch-npu==*) torch_npu=${req#torch-npu==} ;;
    sglang==*) sglang=${req#sglang==} ;;
    *) echo "ci/upstream.sh: $PROFILE: unknown source '$req' (vllm-ascend, torch-npu, sglang)" >&2; exit 2 ;;
  esac
done
installed() {  # name -> its installed version, or nothing
  "$PY" -c "import importlib.metadata as m, sys
try: print(m.version(sys.argv[1]))
except m.PackageNotFoundError: pass" "$1"
}
# What an Ascend image already has (its real torch_npu, vllm-ascend) is kept: a profile
# fills in what is missing, it never replaces an image's stack. On a CPU machine the
# profile's wheels replace other versions (switching profiles in one environment).
image=0
[ -n "$(installed torch-npu)" ] && image=1
missing=()
for req in "${wheels[@]}"; do
  have=$(installed "${req%%==*}")
  if [ -n "$have" ] && [ "$have" != "${req#*==}" ] && [ "$image" = 1 ]; then
    echo "npu-regress upstream: keeping the image's ${req%%==*} $have (profile $PROFILE pins ${req#*==})"
  elif [ "$have" != "${req#*==}" ]; then
    missing+=("$req")
  fi
done
if [ ${#missing[@]} -gt 0 ]; then
  "$PY" -m pip install -q --no-deps "${missing[@]}"
fi
site=$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
if [ -n "$ascend" ] && [ -n "$(installed vllm-ascend)" ]; then
  echo "npu-regress upstream: keeping installed vllm-ascend $(installed vllm-ascend)"
  ascend=""
fi
rm -f "$site/npu_regress_upstream.pth"
if [ -n "$ascend" ]; then
  dest="$PWD/.upstream/vllm-ascend-$ascend"
  matrix=docs/source/community/versioning_policy.md  # its pairings (preflight)
  soc=${SOC_VERSION:-ascend910b1}
  if [ ! -f "$dest/vllm_ascend/batch_invariant.py" ] || [ ! -f "$dest/$matrix" ] \
      || [ ! -f "$dest/requirements.txt" ] || [ ! -f "$dest/setup.py" ]; then
    SOC_VERSION=$soc "$PY" -m harness.stack.sources unpack vllm-ascend "$ascend" "$dest"
  fi
  # the build-time file, written by the release's own setup.py function (again: the chip
  # may differ from the last setup's)
  "$PY" -m harness.stack.sources build-info "$dest" "$soc"
  echo "$dest" >> "$site/npu_regress_upstream.pth"
fi
# SGLang: its wheel's sglang/ package as released (its JIT kernels' sources included: a
# module finds them at import), none of its requirements
if [ -n "$sglang" ] && [ -n "$(installed sglang)" ]; then
  echo "npu-regress upstream: keeping installed sglang $(installed sglang)"
  sglang=""
fi
if [ -n "$sglang" ]; then
  dest="$PWD/.upstream/sglang-$sglang"
  if [ ! -f "$dest/sglang/srt/batch_invariant_ops/batch_invariant_ops.py" ]; then
    "$PY" -m harness.stack.sources unpack sglang "$sglang" "$dest"
  fi
  echo "$dest" >> "$site/npu_regress_upstream.pth"
fi
# torch-npu: its files, not an install (importing it needs its torch and CANN). An image
# with a real torch_npu is read from there instead (harness.stack.upstream.torch_npu_file).
rm -rf "$PWD"/.upstream/*.partial
if [ -n "$torch_npu" ]; then
  dest="$PWD/.upstream/torch-npu-$torch_npu"
  if [ ! -f "$dest/torch_npu/include/torch_npu/csrc/core/npu/NpuVariables.h" ]; then
    "$PY" -m harness.stack.sources unpack torch-npu "$torch_npu" "$dest"
  fi
fi
# The declared requirements, under the profile's lock (where it agrees with the profile:
# a locked version outside a declared range or the profile's pin is left out) and with
# torch held where it is: a requirement that needs another torch fails here, named.
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
profile install > "$work/requirements.txt"
"$PY" - "$lock" "$work/requirements.txt" "$work/constraints.txt" <<'PYEOF'
import importlib.metadata as md, pathlib, sys
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version
lock, wanted, out = sys.argv[1], sys.argv[2], pathlib.Path(sys.argv[3])
reqs = {}
for line in pathlib.Path(wanted).read_text().split():
    r = Requirement(line)
    reqs.setdefault(canonicalize_name(r.name), []).append(r)
keep = []
if lock and pathlib.Path(lock).is_file():
    for line in pathlib.Path(lock).read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        pin = Requirement(line)
        version = Version(next(iter(pin.specifier)).version)
        if all(r.specifier.contains(version, prereleases=True)
               for r in reqs.get(canonicalize_name(pin.name), [])):
            keep.append(line)
try:
    keep.append(f"torch=={md.version('torch')}")
except md.PackageNotFoundError:
    pass
out.write_text("\n".join(keep) + "\n")
PYEOF
if [ -s "$work/requirements.txt" ]; then
  "$PY" -m pip install -q -c "$work/constraints.txt" -r "$work/requirements.txt"
fi
profile verify
profile record
"$PY" - <<'PYEOF'
import importlib.util
for name in ("vllm", "verl", "vllm_ascend", "sglang"):
    spec = importlib.util.find_spec(name)
    print(f"npu-regress upstream: {name} -> {spec.submodule_search_locations[0] if spec else 'MISSING'}")
PYEOF
