"""verl's training engine on a machine without an accelerator: a CPU platform for verl's own
platform registry.

verl 0.9.1 resolves its device through ``verl.plugin.platform`` (NVIDIA, Huawei, AMD built in)
and falls back to CUDA when it finds none, so on a CPU runner its FSDP engine stops at
``torch.cuda.set_device`` ("Cannot access accelerator device when none is available"). The
registry is verl's extension point for a new device (``PlatformRegistry.register``,
``set_platform``), the way a vendor adds theirs. This module registers ``cpu`` there (gloo,
device ``"cpu"``) and sets it, only where verl found no accelerator: on an Ascend runner verl's
own Huawei platform stays in charge and nothing here runs.

What the stand-in changes, and nothing else: the device verl places tensors on (``"cpu"``; the
index verl asks for is returned as that name, because verl passes it to ``.to()``), the
process-group backend (gloo) and the no-op device calls (synchronise, empty cache, seeds go to
torch's CPU generator). The engine's forward, its packing, its temperature and its logprob
function are verl's, unchanged.

It must run before ``verl.workers.engine.fsdp`` is imported: that module reads the device name
once, at import.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

#: the name verl's engine registry is asked for: the FSDP engine class registered for
#: ``npu`` (and ``cuda``) is the one an Ascend runner gets, and no engine is registered for
#: ``cpu``; verl reads it from ``VERL_ENGINE_DEVICE``
ENGINE_DEVICE = "npu"
#: the stand-in, once set in this process (a second engine in the process reuses it)
_STANDIN: list[Any] = []


def _platform_class() -> type:
    import torch
    from verl.plugin.platform.platform_base import PlatformBase
    from verl.plugin.platform.platform_manager import PlatformRegistry

    class PlatformCPU(PlatformBase):  # type: ignore[misc, valid-type]
        """verl's device calls on the CPU (npu-regress's stand-in; never auto-detected)."""

        device_name = property(lambda self: "cpu")
        vendor_name = property(lambda self: "cpu")
        device_module = property(lambda self: torch.cpu)

        def is_available(self) -> bool:
            return True

        def is_platform_available(self, use_smi_check: bool = False) -> bool:
            return False  # chosen by ``install`` only, never by verl's detection

        def current_device(self) -> Any:
            return "cpu"

        def device_count(self) -> int:
            return 1

        def set_device(self, device_index: int) -> None:
            return None

        def synchronize(self, device_index: int | None = None) -> None:
            return None

        def manual_seed(self, seed: int) -> None:
            torch.manual_seed(seed)

        def manual_seed_all(self, seed: int) -> None:
            torch.manual_seed(seed)

        def set_allocator_settings(self, settings: str) -> None:
            return None

        def empty_cache(self) -> None:
            return None

        def get_device_capability(self, device_index: int = 0) -> tuple[None, None]:
            return None, None

        def communication_backend_name(self) -> str:
            return "gloo"

        def visible_devices_envvar(self) -> str:
            return "CUDA_VISIBLE_DEVICES"

        @contextlib.contextmanager
        def nvtx_range(self, msg: str) -> Iterator[None]:
            yield

        def profiler_start(self) -> None:
            return None

        def profiler_stop(self) -> None:
            return None

        def ray_resource_name(self) -> str:
            return "CPU"

        def ray_noset_envvars(self) -> list[str]:
            return []

        def is_ipc_supported(self) -> bool:
            return False

        def cudart(self) -> None:
            return None

    return PlatformRegistry.register(platform="cpu")(PlatformCPU)


def install() -> str:
    """verl's platform for this process: its own where it finds an accelerator, else the CPU
    stand-in. Returns the platform's device name ("cpu" when the stand-in is set)."""
    import os

    from verl.plugin.platform import platform_manager
    from verl.utils.device import is_cuda_available, is_npu_available

    if is_cuda_available or is_npu_available:
        return str(platform_manager.get_platform().device_name)
    if _STANDIN:  # already set: registering again would replace it with its own copy
        return "cpu"
    _STANDIN.append(_platform_class()())
    platform_manager.set_platform(_STANDIN[0])
    os.environ.setdefault("VERL_ENGINE_DEVICE", ENGINE_DEVICE)
    return "cpu"
