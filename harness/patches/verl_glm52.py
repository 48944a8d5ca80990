"""The first declared patch set: verl's GLM-5.2 patches (``verl/utils/vllm/npu_vllm_patch.py``
in verl 0.9.1), against the installed vLLM and vllm-ascend, with the call tables of the
behaviour check.

verl imports ``verl.utils.vllm`` (whose ``__init__`` needs vLLM's LoRA models module) only
to reach ``npu_vllm_patch``; the checks import that module alone, as
``harness.stack.upstream.import_upstream`` does for the hardware conformance.
"""

from __future__ import annotations

from typing import Any

from harness.patches.declare import Behaviour, DeclaredPatch

APPLY_MODULE = "verl.utils.vllm.npu_vllm_patch"
MARKER = "_verl_vllm_ascend_glm52_patched"
ENV = {"VERL_VLLM_ASCEND_GLM52_PATCH": "1"}
CORE = "vllm.v1.engine.core"


# --- call tables (stub collaborators: an executor that sleeps by tags, an engine) -----------

class _Executor:
    def __init__(self, asleep: tuple[str, ...], calls: list[str]) -> None:
        self.asleep = set(asleep)
        self.calls = calls

    @property
    def is_sleeping(self) -> bool:
        return bool(self.asleep)

    def wake_up(self, tags: list[str] | None = None) -> None:
        self.calls.append(f"executor.wake_up({tags})")
        self.asleep -= set(self.asleep if tags is None else tags)

    def execute_dummy_batch(self) -> None:
        self.calls.append("executor.execute_dummy_batch()")


class _Engine:
    def __init__(self, asleep: tuple[str, ...]) -> None:
        self.calls: list[str] = []
        self.model_executor = _Executor(asleep, self.calls)

    def resume_scheduler(self) -> None:
        self.calls.append("resume_scheduler()")

    def _set_kv_connector_handshake_metadata(self) -> None:
        self.calls.append("kv_connector_handshake()")


ASLEEP = ("kv_cache", "weights")
WAKE_UP_CASES: dict[str, tuple[list[str] | None, tuple[str, ...]]] = {
    "tags=None, asleep": (None, ASLEEP),
    "tags=['scheduling'], asleep": (["scheduling"], ASLEEP),
    "tags=['weights'], asleep": (["weights"], ASLEEP),
    "tags=['scheduling', 'weights'], asleep": (["scheduling", "weights"], ASLEEP),
    "tags=['kv_cache'], asleep": (["kv_cache"], ASLEEP),
    "tags=['weights', 'kv_cache'], asleep": (["weights", "kv_cache"], ASLEEP),
    "tags=None, awake": (None, ()),
    "tags=['scheduling'], awake": (["scheduling"], ()),
    "tags=['weights'], awake": (["weights"], ()),
}
#: the fix (vLLM 6f1ada0f91): a wake-up that leaves memory asleep does not resume scheduling
WAKE_UP_INTENT = frozenset({"tags=['scheduling'], asleep", "tags=['weights'], asleep",
                            "tags=['scheduling', 'weights'], asleep",
                            "tags=['kv_cache'], asleep"})


def _observe(engine: _Engine, call: Any) -> str:
    try:
        returned = repr(call())
    except Exception as exc:  # noqa: BLE001 - an observation like any other
        returned = f"raised {type(exc).__name__}: {exc}"
    return f"calls {engine.calls}, returned {returned}, " \
           f"{'asleep' if engine.model_executor.is_sleeping else 'awake'} after"


def wake_up_table(wake_up: Any) -> dict[str, str]:
    """``EngineCore.wake_up`` over tags and executor states."""
    table = {}
    for case, (tags, asleep) in WAKE_UP_CASES.items():
        engine = _Engine(asleep)
        table[case] = _observe(engine, lambda e=engine, t=tags: wake_up(e, t))
    return table


#: the fix (vLLM 11d60545e2): no dummy forward while the executor sleeps
DUMMY_BATCH_INTENT = frozenset({"asleep"})


def dummy_batch_table(execute_dummy_batch: Any) -> dict[str, str]:
    """``DPEngineCoreProc.execute_dummy_batch`` with the executor asleep and awake."""
    table = {}
    for case, asleep in (("asleep", ASLEEP), ("awake", ())):
        engine = _Engine(asleep)
        table[case] = _observe(engine, lambda e=engine: execute_dummy_batch(e))
    return table


PATCHES = (
    DeclaredPatch(
        name="verl-glm52-vllm-partial-wake-up",
        apply=f"{APPLY_MODULE}:patch_vllm_glm52_partial_wake_up",
        targets=(f"{CORE}:EngineCore.wake_up", f"{CORE}:DPEngineCoreProc.execute_dummy_batch"),
        marker=MARKER,
        spawn_entry=f"{CORE}:EngineCoreProc.run_engine_core",
        env=ENV,
        skip_inits=("verl.utils.vllm",),
        behaviours=(
            Behaviour(f"{CORE}:EngineCore.wake_up", "harness.patches.verl_glm52:wake_up_table",
                      WAKE_UP_INTENT),
            Behaviour(f"{CORE}:DPEngineCoreProc.execute_dummy_batch",
                      "harness.patches.verl_glm52:dummy_batch_table", DUMMY_BATCH_INTENT),
        ),
        distributions=("verl", "vllm"),
    ),
    DeclaredPatch(
        name="verl-glm52-vllm-ascend",
        apply=f"{APPLY_MODULE}:patch_vllm_ascend_glm52",
        targets=("vllm_ascend.ops.layernorm:AscendRMSNorm.forward_oot",
                 "vllm_ascend.attention.sfa_v1:AscendSFAImpl.process_weights_after_loading",
                 "vllm_ascend.attention.sfa_v1:dispose_layer",
                 "vllm_ascend.attention.sfa_v1:DeviceOperator.indexer_select_post_process"),
        marker=MARKER,
        env=ENV,
        skip_inits=("verl.utils.vllm",),
        standin=True,
        distributions=("verl", "vllm-ascend", "vllm"),
        # DeviceOperator is get_device_adaptor()'s answer: the A2/A3 adaptor class
        sources={"vllm_ascend.attention.sfa_v1:DeviceOperator.indexer_select_post_process":
                 "vllm_ascend.device.device_op:BaseDeviceAdaptor.indexer_select_post_process"},
        # verl's _patch_glm52_sfa_kv_b_proj_disposal wraps dispose_layer (functools.wraps,
        # no marker) in the same step as process_weights_after_loading, whose marker makes
        # a second apply return before either is touched again
        guarded_by={"vllm_ascend.attention.sfa_v1:dispose_layer":
                    "vllm_ascend.attention.sfa_v1:AscendSFAImpl.process_weights_after_loading"},
    ),
)
