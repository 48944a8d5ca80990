"""The built-in batch-invariance targets: reference (ours), vllm_ascend (NPU, or the CPU
stand-in), verl (verl's rollout switch over vllm_ascend), sglang (NPU, or the CPU
stand-in), vllm (CUDA and CPU).

The upstream adapters run the released code (CI: the upstream set of ``ci/upstream.txt``)
and skip, naming the missing piece, where it is not installed.
"""

from __future__ import annotations

import importlib
import os
import types
from collections.abc import Callable
from typing import Any
from unittest import mock

from harness.invariance import verl_switch
from harness.invariance.target import (
    SWITCH_ENV,
    Expect,
    InvarianceTarget,
    has_module,
    no_invariant_events,
)
from harness.stack.upstream import UpstreamApiMoved, require, source_file

#: the reference's "vendor" fused kernel (kept here: the parent must not import the
#: reference module, which registers ops)
FUSED_ADD_RMS_NORM = "harness_ref::fused_add_rms_norm"


class OpSetTarget(InvarianceTarget):
    """A target whose switch installs a ``batch_invariant_ops`` op set, and replaces a fused
    add_rms_norm kernel by add + an rms_norm op: what each check must see run is a table."""

    module_name = ""
    #: check -> the invariant op event it must show when on
    OPS: dict[str, str] = {}
    RMS_NORM_EVENT = ""
    FUSED_ADD_RMS_NORM_EVENT = ""

    def expectations(self, check: str, enabled: bool) -> list[Expect]:
        if check == "add_rms_norm":
            if enabled:
                return [Expect("aten::add", True), Expect(self.RMS_NORM_EVENT, True),
                        Expect(self.FUSED_ADD_RMS_NORM_EVENT, False)]
            return [Expect(self.FUSED_ADD_RMS_NORM_EVENT, True), *no_invariant_events()]
        if not enabled:
            return no_invariant_events()
        op = self.OPS.get(check)
        return [Expect(op, True)] if op else []

    def _module(self) -> types.ModuleType:
        return importlib.import_module(self.module_name)

    def load(self) -> None:
        self._module()


class ReferenceTarget(OpSetTarget):
    """Our own op set (``harness.invariance.reference``): runs on every device kind."""

    name = "reference"
    devices = ("cpu", "cuda", "npu")
    module_name = "harness.invariance.reference"
    OPS = {
        "mm": "batch_invariant_ops::mm",
        "matmul": "batch_invariant_ops::mm",
        "torch_sum": "batch_invariant_ops::reduce_sum",
        "tensor_sum": "batch_invariant_ops::reduce_sum",
    }
    RMS_NORM_EVENT = "batch_invariant_ops::rms_norm"
    FUSED_ADD_RMS_NORM_EVENT = FUSED_ADD_RMS_NORM

    def unavailable(self, device_kind: str, npu_missing: str | None) -> str | None:
        return None if has_module("torch") else "torch is not installed"

    def set_switch(self, enabled: bool) -> None:
        os.environ[SWITCH_ENV] = "1" if enabled else "0"
        self._module().init_batch_invariance()

    def is_enabled(self) -> bool:
        return bool(self._module().is_enabled())

    def reduce_sum(self) -> Any:
        return self._module().reduce_sum

    def add_rms_norm(self) -> Callable[..., Any]:
        return self._module().add_rms_norm

    def attention_binding(self) -> tuple[Any, tuple[Any, ...]]:
        mod = self._module()
        return mod.fused_infer_attention_score, (mod.batch_invariant_attention,)


class AscendOpsTarget(OpSetTarget):
    """A stack whose switch, on an NPU, registers the AscendC ``batch_invariant_ops`` and
    rebinds torch_npu's fused kernels (vllm-ascend, SGLang): on a real NPU, or, on a machine
    without one, the released sources on the CPU-backed stand-in device
    (``harness.invariance.standin``: the NPU key, torch_npu's native ops,
    ``batch_invariant_ops``)."""

    devices = ("npu", "cpu")
    #: the import package that must be installed (its distribution is ``distribution``)
    package = ""
    #: what the adapter uses of the module; a missing one is an upstream API that moved
    UPSTREAM_SYMBOLS: tuple[str, ...] = ()
    RMS_NORM_EVENT = "npu::npu_rms_norm"
    FUSED_ADD_RMS_NORM_EVENT = "npu::npu_add_rms_norm"
    ATTENTION_OP = "npu_fused_infer_attention_score_batch_invariant"

    def unavailable(self, device_kind: str, npu_missing: str | None) -> str | None:
        if not has_module(self.package):
            return f"{self.package} is not installed"
        if device_kind == "npu":
            for module in ("torch_npu", "batch_invariant_ops"):
                if not has_module(module):
                    return f"{module} is not installed"
            return None
        if device_kind != "cpu":
            return f"runs on an NPU or on the CPU stand-in: the session device is {device_kind}"
        if has_module("torch_npu"):
            return (f"torch_npu is installed but the session has no NPU ({npu_missing}): the "
                    "CPU stand-in would hide it")
        return None

    def device(self) -> Any:
        from harness.stack import devices

        if devices.device_kind() == "npu":
            return devices.device()
        from harness.invariance import standin

        standin.install()
        return standin.torch_device()

    def _import(self) -> types.ModuleType:
        """The switch module, imported (SGLang's needs two package inits skipped)."""
        return importlib.import_module(self.module_name)

    def _module(self) -> types.ModuleType:
        module = self._import()
        require(module, self.distribution, self.UPSTREAM_SYMBOLS)
        return module

    def is_enabled(self) -> bool:
        return getattr(self._module(), "_batch_invariant_LIB", None) is not None

    def add_rms_norm(self) -> Callable[..., Any]:
        import torch_npu

        npu_add_rms_norm: Callable[..., Any] = torch_npu.npu_add_rms_norm
        return npu_add_rms_norm

    def attention_binding(self) -> tuple[Any, tuple[Any, ...]]:
        import torch
        import torch_npu

        packet = getattr(torch.ops.batch_invariant_ops, self.ATTENTION_OP)
        return torch_npu.npu_fused_infer_attention_score, (packet, packet.default)


class VllmAscendTarget(AscendOpsTarget):
    """vllm-ascend's AscendC path (``vllm_ascend.batch_invariant``)."""

    name = "vllm_ascend"
    module_name = "vllm_ascend.batch_invariant"
    distribution = "vllm-ascend"
    package = "vllm_ascend"
    UPSTREAM_SYMBOLS = ("init_batch_invariance", "enable_batch_invariant_mode",
                        "override_envs_for_invariance", "_batch_invariant_LIB",
                        "HAS_ASCENDC_BATCH_INVARIANT", "reduce_sum")
    OPS = {
        "mm": "batch_invariant_ops::npu_mm_batch_invariant",
        "matmul": "batch_invariant_ops::npu_matmul_batch_invariant",
        "torch_sum": "batch_invariant_ops::npu_reduce_sum_batch_invariant",
        "tensor_sum": "batch_invariant_ops::npu_reduce_sum_batch_invariant",
    }

    def set_switch(self, enabled: bool) -> None:
        os.environ[SWITCH_ENV] = "1" if enabled else "0"
        self._init()

    def _init(self) -> None:
        """Run init with ``get_ascend_config`` patched: the real one needs a live vLLM config."""
        module = self._module()
        config_module = importlib.import_module("vllm_ascend.ascend_config")
        config = types.SimpleNamespace(weight_nz_mode=1, enable_matmul_allreduce=True)
        self._config = config  # what override_envs_for_invariance changes, read afterwards
        with mock.patch.object(config_module, "get_ascend_config", return_value=config):
            if hasattr(module, "get_ascend_config"):  # imported by name into the module
                with mock.patch.object(module, "get_ascend_config", return_value=config):
                    module.init_batch_invariance()
            else:
                module.init_batch_invariance()

    def config_object(self) -> Any:
        return getattr(self, "_config", None)

    def reduce_sum(self) -> Any:
        fn = getattr(self._module(), "reduce_sum", None)
        if fn is None:
            raise AssertionError(f"{self.module_name} has no reduce_sum to compare torch.sum with")
        return fn


class SglangTarget(AscendOpsTarget):
    """SGLang's Ascend path (``sglang.srt.batch_invariant_ops``): on an NPU it registers
    ``npu_batch_invariant_ops``' AscendC ops for mm, matmul, mean.dim and _log_softmax and
    rebinds torch_npu's FIA and add_rms_norm; switched by ``--enable-deterministic-inference``
    (``harness.invariance.sglang_switch``). It has no sum override and no variable of its
    own; ``disable_batch_invariant_mode()`` turns it off in the process."""

    name = "sglang"
    module_name = "sglang.srt.batch_invariant_ops.batch_invariant_ops"
    distribution = "sglang"
    package = "sglang"
    UPSTREAM_SYMBOLS = ("enable_batch_invariant_mode", "disable_batch_invariant_mode",
                        "_batch_invariant_LIB")
    OPS = {
        "mm": "batch_invariant_ops::npu_mm_batch_invariant",
        "matmul": "batch_invariant_ops::npu_matmul_batch_invariant",
    }
    switch_variable = None
    in_process_off = "disable_batch_invariant_mode()"

    def switch_env(self, enabled: bool) -> dict[str, str | None]:
        return {SWITCH_ENV: None}  # not SGLang's: a runner's export must not matter

    def not_applicable(self, check: str) -> str | None:
        if check in ("torch_sum", "tensor_sum"):
            return (f"{self.release()}'s switch has no sum override (it overrides "
                    f"{', '.join(sorted(self.declared().ops or ()))}; "
                    f"{self.declared().ops_source}): see the coverage table")
        return None

    def device(self) -> Any:
        dev = super().device()
        from harness.stack import devices

        if devices.device_kind() != "npu":
            from harness.invariance import standin_triton

            standin_triton.install()  # triton-ascend, for the kernels' definitions only
        return dev

    def _import(self) -> types.ModuleType:
        from harness.invariance import sglang_switch

        return sglang_switch.load()

    def set_switch(self, enabled: bool) -> None:
        from harness.invariance import sglang_switch

        self._gate = sglang_switch.turn_switch(enabled)

    def evidence(self) -> dict[str, Any]:
        from harness.invariance import sglang_switch

        return {"switch_flag": sglang_switch.FLAG, "gate": getattr(self, "_gate", None)}

    def switch_off(self) -> bool:
        self._module().disable_batch_invariant_mode()
        return True


class VerlTarget(VllmAscendTarget):
    """verl's switch over vllm-ascend, turned the way verl's users turn it: the rollout option
    ``actor_rollout_ref.rollout.full_determinism`` in verl's own PPO config, which verl's
    ``run_ppo`` turns into VLLM_BATCH_INVARIANT for itself and, through the Ray runtime env,
    for every Ray actor (where verl's vLLM engines run). The harness never sets the variable:
    the child runs ``run_ppo`` on a local Ray with a probe actor in place of verl's task
    runner, then vllm-ascend's init, then the vllm_ascend checks
    (``harness.invariance.verl_switch``)."""

    name = "verl"
    distribution = "verl"
    #: verl's switch runs vllm-ascend's init: vllm-ascend's declaration applies
    declared_as = ("vllm_ascend", "vllm-ascend")
    #: a case with Ray's start: median 10.5 s (9.4-11.8 s, 14 cases) on an idle 2-core
    #: runner; at load average 15-25 three cases passed 180 s while Ray was still starting
    start_cost_s = 10.5
    #: verl's import (3-4 s a case here) in a server of the case's environment; it decides
    #: there, as in the child, that there is no NPU (the stand-in comes after it)
    child_imports = (verl_switch.MAIN_PPO,)

    def unavailable(self, device_kind: str, npu_missing: str | None) -> str | None:
        if not has_module("verl"):
            return "verl is not installed"
        return super().unavailable(device_kind, npu_missing)

    def release(self) -> str:
        from harness.stack.upstream import release

        return f"{release('verl')} over {release('vllm-ascend')}"

    def switch_env(self, enabled: bool) -> dict[str, str | None]:
        from harness.invariance.declared import unset_env

        return unset_env(self.declared())  # the variable is verl's to set

    def device(self) -> Any:
        verl_switch.load()
        return super().device()

    def set_switch(self, enabled: bool) -> None:
        self.worker_env = verl_switch.turn_switch(enabled)
        self._init()

    def evidence(self) -> dict[str, Any]:
        return {"ray_worker_env": self.worker_env}

    def judge_evidence(self, got: dict[str, Any], enabled: bool) -> list[str]:
        want = "1" if enabled else "0"
        seen = got["ray_worker_env"].get(SWITCH_ENV)
        if seen != want:
            return [f"a Ray actor started by verl's run_ppo saw {SWITCH_ENV}={seen!r} with "
                    f"full_determinism={enabled}, expected {want!r}"]
        return []


def registration_keys(source: str) -> set[str]:
    """The dispatch keys a module's ``Library.impl(op, fn, KEY)`` calls name: the string
    literals, and ``"<platform>"`` for a key computed at run time (vLLM 0.33.0's)."""
    import ast

    keys: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "impl" and len(node.args) >= 3:
            key = node.args[2]
            keys.add(key.value if isinstance(key, ast.Constant) and isinstance(key.value, str)
                     else "<platform>")
    return keys


class VllmTarget(InvarianceTarget):
    """vLLM's module, on CUDA and on CPU (vllm 0.33.0 enables there: its platform is
    "unspecified", key CPU, and it registers softmax, log_softmax, mean and bmm kernels).
    vLLM registers its kernels straight on aten ops, so it emits no ``batch_invariant_ops::``
    events: the switch (by identity), the off rule and the dispatcher footprint apply."""

    name = "vllm"
    devices = ("cuda", "cpu")
    distribution = "vllm"
    MODULES = ("vllm.model_executor.layers.batch_invariant",
               "vllm.model_executor.determinism.batch_invariant")
    #: what the adapter uses of the module; a missing one is an upstream API that moved
    UPSTREAM_SYMBOLS = ("init_batch_invariance", "_batch_invariant_LIB")

    def unavailable(self, device_kind: str, npu_missing: str | None) -> str | None:
        if not has_module("vllm"):
            return "vllm is not installed"
        # by file, not by import: an install whose import fails must fail in the child
        path = next((p for m in self.MODULES if (p := source_file(m))), None)
        if path is None:
            return f"vllm has neither {' nor '.join(self.MODULES)}"
        keys = registration_keys(path.read_text(encoding="utf-8", errors="replace"))
        if keys == {"CUDA"} and device_kind != "cuda":
            # vLLM 0.23.0/0.24.0: every override on the CUDA key, cuBLASLt set unconditionally
            return (f"{self.release()} registers its batch-invariant kernels on the CUDA "
                    f"dispatch key only ({path.name}: every .impl(..., \"CUDA\")): nothing to "
                    f"switch on a {device_kind} session")
        if device_kind not in self.devices:
            return f"runs on CUDA or CPU: the session device is {device_kind}"
        return None

    def not_applicable(self, check: str) -> str | None:
        if check in ("mm", "matmul"):
            return ("vLLM overrides aten::mm/matmul (SM80, ROCm, XPU only) with Triton kernels "
                    "registered on aten itself: no batch_invariant_ops:: event exists to prove "
                    "they ran; the switch case's dispatcher footprint shows what it registered")
        if check in ("torch_sum", "tensor_sum", "add_rms_norm", "fused_infer_attention_score"):
            return f"vLLM's batch-invariant mode does not rebind {check} (vllm-ascend only)"
        return None

    def _module(self) -> types.ModuleType:
        for name in self.MODULES:
            if source_file(name):
                module = importlib.import_module(name)
                require(module, self.distribution, self.UPSTREAM_SYMBOLS)
                return module
        raise UpstreamApiMoved(f"upstream API moved: {self.release()} has neither "
                            f"{' nor '.join(self.MODULES)}")

    def load(self) -> None:
        self._module()


    def set_switch(self, enabled: bool) -> None:
        os.environ[SWITCH_ENV] = "1" if enabled else "0"
        self._module().init_batch_invariance()

    def is_enabled(self) -> bool:
        return getattr(self._module(), "_batch_invariant_LIB", None) is not None
