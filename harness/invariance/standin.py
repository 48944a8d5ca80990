"""A CPU-backed stand-in for the NPU, so that the released vllm-ascend code runs on CPU.

What cannot exist on a CPU is stood in for, nothing more: the device (PyTorch's PrivateUse1
backend renamed ``npu``, the way PyTorch tests out-of-tree backends, so that "NPU" parses as
a dispatch key and the release's ``Library.impl(..., "NPU")`` calls are real registrations),
torch_npu's native ops (``npu_rms_norm``, ``npu_add_rms_norm``,
``npu_fused_infer_attention_score`` as ``npu::`` operators, the graph-handler registry of
``torch_npu.npu``) and the AscendC ``batch_invariant_ops`` package
(``npu_mm_batch_invariant``..., what vllm-ascend and SGLang call). Tensors on the stand-in
device are wrapper tensors holding a CPU tensor: an operator with a kernel registered for
the NPU key runs that kernel (so a release's overrides and their profiler events are real),
any other runs on the CPU payload. The stand-in ops compute what the CPU reference ops
compute (``harness.invariance.reference``), bit for bit.

Child side only, once per process (``install()``): it changes global torch state.
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_map

DEVICE = "npu"
_KEY = torch._C.DispatchKey.PrivateUse1
_STATE: dict[str, Any] = {}


class NpuTensor(torch.Tensor):
    """A tensor on the stand-in device: its values live in ``payload``, a CPU tensor."""

    payload: torch.Tensor

    @staticmethod
    def __new__(cls, payload: torch.Tensor) -> NpuTensor:
        out = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls, payload.size(), strides=payload.stride(), dtype=payload.dtype,
            device=torch_device(), requires_grad=payload.requires_grad)
        out.payload = payload
        return out

    def __repr__(self) -> str:  # type: ignore[override]
        return f"NpuTensor({self.payload!r})"

    @classmethod
    def __torch_dispatch__(cls, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        if torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "PrivateUse1"):
            # a kernel registered for the NPU key: a release's override or a stand-in op
            return func.redispatch(torch._C.DispatchKeySet(_KEY), *args, **kwargs)
        if func is torch.ops.aten._to_copy.default and _is_cpu(kwargs.get("device")):
            return func(*tree_map(_unwrap, args), **kwargs)
        out = func(*tree_map(_unwrap, args), **tree_map(_to_cpu_device, kwargs))
        return tree_map(_wrap, out)


def _is_cpu(device: Any) -> bool:
    return device is not None and torch.device(device).type == "cpu"


def _unwrap(x: Any) -> Any:
    return x.payload if isinstance(x, NpuTensor) else x


def _wrap(x: Any) -> Any:
    return NpuTensor(x) if isinstance(x, torch.Tensor) and not isinstance(x, NpuTensor) else x


def _to_cpu_device(x: Any) -> Any:
    if isinstance(x, torch.device) and x.type == DEVICE:
        return torch.device("cpu")
    return x


def _is_npu(device: Any) -> bool:
    if isinstance(device, int | str | torch.device):
        try:
            return torch.device(device).type == DEVICE
        except (RuntimeError, TypeError):
            return False
    return False


class _OntoStandin(TorchFunctionMode):
    """Tensors made for, or moved to, the stand-in device become ``NpuTensor``s."""

    def __torch_function__(self, func: Any, types: Any, args: Any = (),
                           kwargs: Any = None) -> Any:
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.to and args and \
                isinstance(args[0], torch.Tensor) and not isinstance(args[0], NpuTensor):
            target = kwargs.pop("device", None)
            rest = list(args[1:])
            if target is None and rest and _is_npu(rest[0]):
                target = rest.pop(0)
            if _is_npu(target):
                moved = args[0].to(*rest, **kwargs) if rest or kwargs else args[0]
                return NpuTensor(moved.detach().clone() if moved is args[0] else moved)
            return func(*args, **({"device": target} if target is not None else {}), **kwargs)
        if _is_npu(kwargs.get("device")):
            kwargs["device"] = "cpu"
            return tree_map(_wrap, func(*args, **kwargs))
        return func(*args, **kwargs)


def _device_module() -> types.ModuleType:
    mod = types.ModuleType("torch.npu")
    mod.is_available = lambda: True  # type: ignore[attr-defined]
    mod.device_count = lambda: 1  # type: ignore[attr-defined]
    mod.current_device = lambda: 0  # type: ignore[attr-defined]
    mod.set_device = lambda device: None  # type: ignore[attr-defined]
    mod.synchronize = lambda device=None: None  # type: ignore[attr-defined]
    mod.is_initialized = lambda: True  # type: ignore[attr-defined]
    mod._is_in_bad_fork = lambda: False  # type: ignore[attr-defined]
    # torch_npu.npu's graph-capture handler registry (Python in torch_npu; SGLang's NPU
    # batch-invariant ops register a handler for their FIA op at import)
    mod.NpuGraphOpHandler = NpuGraphOpHandler  # type: ignore[attr-defined]
    mod.register_npu_graph_handler = register_npu_graph_handler  # type: ignore[attr-defined]
    return mod


#: op name -> its graph-capture handler (``register_npu_graph_handler``)
GRAPH_HANDLERS: dict[str, type] = {}


class NpuGraphOpHandler:
    """torch_npu.npu's base class of an op's graph-capture handler: capture unchanged."""

    @classmethod
    def prepare_capture(cls, func: Any, args: Any, kwargs: Any) -> Any:
        return func, args, kwargs


def register_npu_graph_handler(names: list[str]) -> Any:
    def register(handler: type) -> type:
        for name in names:
            GRAPH_HANDLERS[name] = handler
        return handler

    return register


# --- the native ops, computed as the CPU reference computes them ---------------------------

def _native(fn: Any) -> Any:
    """A kernel on CPU payloads: unwrap the arguments, wrap the results."""

    def kernel(*args: Any, **kwargs: Any) -> Any:
        return tree_map(_wrap, fn(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs)))

    return kernel


def _define(lib: torch.library.Library, schema: str, fn: Any) -> None:
    name = schema.split("(", 1)[0]
    lib.define(schema)
    lib.impl(name, _native(fn), "PrivateUse1")
    lib.impl(name, fn, "CPU")


def _install_ops() -> tuple[types.ModuleType, types.ModuleType]:
    from harness.invariance import reference as ref

    npu_lib = torch.library.Library("npu", "FRAGMENT")
    bio_lib = torch.library.Library("batch_invariant_ops", "FRAGMENT")
    _STATE["libs"] = (npu_lib, bio_lib)

    def rms_norm(x: torch.Tensor, gamma: torch.Tensor, epsilon: float = 1e-6
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        xf = x.float()
        rstd = torch.rsqrt(ref._mean_impl(xf * xf, [-1], True) + epsilon)
        return ref._rms_norm_impl(x, gamma, epsilon), rstd

    def add_rms_norm(x1: torch.Tensor, x2: torch.Tensor, gamma: torch.Tensor,
                     epsilon: float = 1e-6) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        added = x1 + x2
        out, rstd = rms_norm(added, gamma, epsilon)
        return out, rstd, added

    def attention(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor]:
        out = ref._attention(query, key, value)
        return out, out.new_zeros(())

    def attention_bi(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor]:
        out = ref.batch_invariant_attention(query, key, value)
        return out, out.new_zeros(())

    def workspace(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor
                  ) -> torch.Tensor:
        return query.new_empty((0,), dtype=torch.uint8)  # the CPU attention needs none

    def reduce_sum(x: torch.Tensor, dim: int | None = None, keepdim: bool = False, *,
                   dtype: torch.dtype | None = None) -> torch.Tensor:
        _reduce_sum_constraints(x, dim)
        dims = None if dim is None else [dim]
        return ref._reduce_sum_impl(x, dims, keepdim, dtype)

    _define(npu_lib, "npu_rms_norm(Tensor self, Tensor gamma, float epsilon=1e-06) "
                     "-> (Tensor, Tensor)", rms_norm)
    _define(npu_lib, "npu_add_rms_norm(Tensor x1, Tensor x2, Tensor gamma, "
                     "float epsilon=1e-06) -> (Tensor, Tensor, Tensor)", add_rms_norm)
    _define(npu_lib, "npu_fused_infer_attention_score(Tensor query, Tensor key, Tensor value)"
                     " -> (Tensor, Tensor)", attention)
    _define(bio_lib, "npu_mm_batch_invariant(Tensor self, Tensor mat2) -> Tensor",
            ref._mm_impl)
    _define(bio_lib, "npu_matmul_batch_invariant(Tensor self, Tensor other) -> Tensor",
            ref._matmul_impl)
    _define(bio_lib, "npu_reduce_sum_batch_invariant(Tensor self, int? dim=None, "
                     "bool keepdim=False, *, ScalarType? dtype=None) -> Tensor", reduce_sum)
    _define(bio_lib, "npu_fused_infer_attention_score_batch_invariant(Tensor query, "
                     "Tensor key, Tensor value) -> (Tensor, Tensor)", attention_bi)
    # what SGLang's NPU batch-invariant ops call besides (its npu_batch_invariant_ops.py)
    _define(bio_lib, "npu_reduce_mean_batch_invariant(Tensor self, int dim, "
                     "bool keepdim=False) -> Tensor",
            lambda x, dim, keepdim=False: ref._mean_impl(x, [dim], keepdim))
    _define(bio_lib, "npu_log_softmax_batch_invariant(Tensor self, int dim) -> Tensor",
            ref._log_softmax_impl)
    _define(bio_lib, "_npu_fused_infer_attention_score_batch_invariant_get_max_workspace("
                     "Tensor query, Tensor key, Tensor value) -> Tensor", workspace)
    _define(npu_lib, "_npu_fused_infer_attention_score_get_max_workspace(Tensor query, "
                     "Tensor key, Tensor value) -> Tensor", workspace)

    torch_npu = types.ModuleType("torch_npu")
    torch_npu.__doc__ = "harness.invariance.standin: torch_npu's native ops on a CPU-backed NPU"
    torch_npu.npu = torch.npu  # type: ignore[attr-defined]
    torch_npu.npu_rms_norm = torch.ops.npu.npu_rms_norm  # type: ignore[attr-defined]
    torch_npu.npu_add_rms_norm = torch.ops.npu.npu_add_rms_norm  # type: ignore[attr-defined]
    torch_npu.npu_fused_infer_attention_score = (  # type: ignore[attr-defined]
        torch.ops.npu.npu_fused_infer_attention_score)
    torch_npu._npu_fused_infer_attention_score_get_max_workspace = (  # type: ignore[attr-defined]
        torch.ops.npu._npu_fused_infer_attention_score_get_max_workspace)
    bio = types.ModuleType("batch_invariant_ops")
    bio.__doc__ = "harness.invariance.standin: the AscendC batch-invariant ops on a CPU-backed NPU"
    return torch_npu, bio


def _register_device_guard() -> None:
    """A device guard for the stand-in key: indexing and ``contiguous`` of a tensor take a
    guard on its device ("PyTorch is not linked with support for npu devices" without one),
    and an override may slice its input (a batch-split ``reduce_sum`` does)."""
    from torch.utils.backend_registration import _DummyDeviceGuard

    acc = getattr(torch._C, "_acc", None)
    register = getattr(acc, "register_python_privateuseone_device_guard", None)
    if register is not None:
        guard = _DummyDeviceGuard()
        _STATE["guard"] = guard  # kept alive: the dispatcher holds only a reference
        register(guard)


#: the reduce-sum kernel's documented constraints (vllm-ascend PR #16413, which guarded
#: the callers after ``.sum(dim=0)`` raised on the NPU): last dimension only, these dtypes
REDUCE_SUM_DTYPES = (torch.float16, torch.bfloat16, torch.float32)


def _reduce_sum_constraints(x: torch.Tensor, dim: int | None) -> None:
    """Refuse what the AscendC kernel refuses, with its error code. ``dim=None`` (a full
    reduction) is not refused: its constraint is not documented."""
    if dim is not None and dim not in (-1, x.dim() - 1):
        raise RuntimeError(f"EZ1001: Provided dim only support last dim (stand-in for the "
                           f"AscendC npu_reduce_sum_batch_invariant: dim={dim} of a "
                           f"{x.dim()}-d tensor)")
    if x.dtype not in REDUCE_SUM_DTYPES:
        raise RuntimeError(f"EZ1001: npu_reduce_sum_batch_invariant supports float16, "
                           f"bfloat16 and float32 only, not {x.dtype} (stand-in)")


def torch_device() -> torch.device:
    return torch.device(DEVICE, 0)


def install() -> None:
    """Make ``npu`` a working (CPU-backed) device in this process, with torch_npu's native ops
    and the ``batch_invariant_ops`` package."""
    if _STATE.get("installed"):
        return
    torch.utils.rename_privateuse1_backend(DEVICE)
    torch._register_device_module(DEVICE, _device_module())
    _register_device_guard()
    torch_npu, bio = _install_ops()
    # a spec, as imported modules have: importlib.util.find_spec (transformers asks it
    # whether torch_npu exists) raises on a module in sys.modules without one
    for module in (torch_npu, bio):
        module.__spec__ = importlib.machinery.ModuleSpec(module.__name__, None)
    sys.modules["torch_npu"] = torch_npu
    sys.modules["torch_npu.npu"] = torch.npu  # type: ignore[attr-defined]
    sys.modules["batch_invariant_ops"] = bio
    mode = _OntoStandin()
    mode.__enter__()
    _STATE.update(installed=True, mode=mode)


# --- the rest of torch_npu's surface, for importing code that only names it ----------------

class NotStoodIn(NotImplementedError):
    """A torch_npu native symbol that the CPU stand-in does not compute."""


class _NativeNamespace(type):
    """The type of a stood-in native class: its attributes are native symbols too
    (``torch_npu._C._NPUTaskGroupHandle`` in a class annotation of vllm-ascend 0.23.0)."""

    def __getattr__(cls, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _native_symbol(f"{cls.__module__}.{cls.__name__}", name)


def _native_symbol(prefix: str, name: str) -> Any:
    """A class (for CamelCase names, ``_C`` and ``_NPUThing`` included: annotations like
    ``NPUGraph | None`` must work, and its attributes are native symbols) or a callable whose
    call raises ``NotStoodIn`` naming the symbol."""
    full = f"{prefix}.{name}"

    def refuse(*_args: Any, **_kwargs: Any) -> Any:
        raise NotStoodIn(f"{full} is native torch_npu code: the CPU stand-in does not run it")

    if name.lstrip("_")[:1].isupper():
        return _NativeNamespace(name, (), {"__init__": refuse, "__module__": prefix})
    refuse.__name__ = refuse.__qualname__ = name
    return refuse


def _answer_any_name(module: types.ModuleType) -> None:
    def module_getattr(name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return _native_symbol(module.__name__, name)

    module.__getattr__ = module_getattr  # type: ignore[method-assign]


class _NativeSubmodules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import torch_npu.<anything>``: a module whose every name is a native symbol."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name.startswith("torch_npu.") and name not in sys.modules:
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: Any) -> types.ModuleType:
        module = types.ModuleType(spec.name)
        module.__path__ = []
        _answer_any_name(module)
        return module

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def stand_in_native_names() -> None:
    """After ``install``: every other torch_npu name (and ``torch.npu`` name, and
    ``torch_npu.*`` submodule) exists and raises ``NotStoodIn`` when used, so code that only
    imports or annotates with them (vllm-ascend's modules, for the patch guard) can import on
    CPU. Not for the switch checks, whose code paths must not see names that do not exist."""
    install()
    if _STATE.get("native_names"):
        return
    torch_npu = sys.modules["torch_npu"]
    torch_npu.__path__ = []  # a package: its submodules come from _NativeSubmodules
    _answer_any_name(torch_npu)
    _answer_any_name(torch.npu)  # type: ignore[attr-defined]
    sys.meta_path.insert(0, _NativeSubmodules())
    _STATE["native_names"] = True
