"""A stand-in for triton-ascend's ``triton`` module, for code that only *defines* kernels.

SGLang's ``batch_invariant_ops`` module imports ``triton`` at its top and decorates its
Triton kernels there; on an Ascend runner that ``triton`` is triton-ascend (NPU only), and
the NPU path of the switch registers the AscendC ops, never launching a Triton kernel. On a
CPU machine there is no triton-ascend, so this gives what defining kernels needs (``jit``,
``autotune``, ``heuristics``, ``Config``, ``cdiv``, ``next_power_of_2``, ``language``'s
names for annotations) and nothing that computes: launching a kernel raises ``NotStoodIn``
naming it. Installed only where no ``triton`` is importable (a real one is never hidden).

Child side only (``install()`` changes ``sys.modules``).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
import types
from typing import Any

from harness.invariance.standin import NotStoodIn

#: the marker a stood-in ``triton`` carries (``is_stood_in``)
MARK = "__npu_regress_stand_in__"


class Kernel:
    """A decorated kernel: it can be named, indexed by a grid and autotuned, never run."""

    def __init__(self, fn: Any) -> None:
        self.fn = fn
        self.__name__ = getattr(fn, "__name__", "kernel")
        self.__doc__ = getattr(fn, "__doc__", None)

    def __getitem__(self, grid: Any) -> Any:
        return self._refuse

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._refuse()

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise NotStoodIn(f"Triton kernel {self.__name__}: triton-ascend is NPU-only, and the "
                         "CPU stand-in defines kernels without running them")

    def __repr__(self) -> str:
        return f"<stand-in Triton kernel {self.__name__}>"


def jit(fn: Any = None, **_options: Any) -> Any:
    """``@triton.jit`` and ``@triton.jit(...)``."""
    if fn is None:
        return lambda f: Kernel(f)
    return Kernel(fn)


def _decorator(*_args: Any, **_kwargs: Any) -> Any:
    """``@triton.autotune(...)``, ``@triton.heuristics(...)``: the kernel unchanged."""
    return lambda kernel: kernel if isinstance(kernel, Kernel) else Kernel(kernel)


class Config:
    """``triton.Config(kwargs, num_warps=..., num_stages=...)``: kept, never used."""

    def __init__(self, kwargs: Any = None, **options: Any) -> None:
        self.kwargs = dict(kwargs or {})
        self.options = options


def cdiv(x: int, y: int) -> int:
    return (x + y - 1) // y


def next_power_of_2(n: int) -> int:
    return 1 if n <= 1 else 1 << (int(n) - 1).bit_length()


class constexpr:  # noqa: N801 - triton.language's name
    """``tl.constexpr``: an annotation, and a wrapper of a compile-time value."""

    def __init__(self, value: Any = None) -> None:
        self.value = value


def _module(name: str, attrs: dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__dict__.update(attrs)
    module.__spec__ = importlib.machinery.ModuleSpec(name, None, is_package=True)
    module.__path__ = []
    setattr(module, MARK, True)

    def module_getattr(attr: str) -> Any:
        # every other name (tl.float32, tl.program_id, triton.runtime.driver...) exists as a
        # symbol that refuses to compute
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Symbol(f"{name}.{attr}")

    module.__getattr__ = module_getattr  # type: ignore[method-assign]
    return module


class _Symbol:
    """Any other name of the stood-in ``triton``: usable in definitions, refused when run."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Symbol(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise NotStoodIn(f"{self._name}: triton-ascend is NPU-only (CPU stand-in)")

    def __repr__(self) -> str:
        return f"<stand-in {self._name}>"


def is_stood_in() -> bool:
    return bool(getattr(sys.modules.get("triton"), MARK, False))


def install() -> bool:
    """Put the stand-in in ``sys.modules`` unless a real ``triton`` is importable; True if
    it did (or had)."""
    if is_stood_in():
        return True
    if "triton" in sys.modules or importlib.util.find_spec("triton") is not None:
        return False
    # torch asks once whether Triton exists (and caches it): it must hear the truth, no,
    # or torch._inductor imports triton.backends to compile with it
    from torch.utils._triton import has_triton_package

    has_triton_package()
    language = _module("triton.language", {"constexpr": constexpr})
    triton = _module("triton", {
        "jit": jit, "autotune": _decorator, "heuristics": _decorator, "Config": Config,
        "cdiv": cdiv, "next_power_of_2": next_power_of_2, "language": language,
        "__version__": "0.0.0+npu-regress-stand-in",
    })
    sys.modules["triton"] = triton
    sys.modules["triton.language"] = language
    return True
