#!/usr/bin/env bash
# Here (with PyPI): what bench/device/cuda_check.sh carries to a device machine that cannot
# download: the harness's small dependencies the device image lacks, as wheels, and vLLM
# 0.23.0's Python sources (its .py and .json files, no compiled extension; about 6 MB).
set -euo pipefail
cd "$(dirname "$0")"
mkdir -p wheels
python3 -m pip download -q --no-deps --only-binary=:all: -d wheels \
  pytest-forked==1.7.5 defusedxml==0.7.1 py==1.11.0
# vLLM 0.23.0 imports zmq (vllm.distributed) on the way to its batch-invariant module
python3 -m pip download -q --no-deps --only-binary=:all: -d wheels --python-version 3.12 \
  --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 pyzmq==26.2.0
# vLLM's Python files from the default profile's install (bash ci/setup.sh --upstream)
vllm_dir=$(python3 -c 'import importlib.metadata as md, os, vllm; assert md.version("vllm") == "0.23.0", md.version("vllm"); print(os.path.dirname(os.path.dirname(vllm.__file__)))')
# Python files only, no dist-info: with vLLM's dist-info beside them (tried on the H200),
# vLLM takes itself for an installed build and imports its compiled vllm._C, which a
# CUDA build for torch 2.9 cannot give the device's torch 2.11; without it, vLLM imports
# (version unknown to itself) and disables its Triton on Triton 3.6 (README: "CUDA rows")
(cd "$vllm_dir" && find vllm \( -name '*.py' -o -name '*.json' \) -print \
  | tar -czf "$OLDPWD/vllm-sources.tgz" -T -)
ls -la wheels vllm-sources.tgz
