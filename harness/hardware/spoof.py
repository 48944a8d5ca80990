"""Pretend, inside one isolated child, to be an Ascend machine of our choosing.

``NpuSpoof(...)`` passed as ``run_isolated(..., spoof=...)`` / ``run_on_npu(..., spoof=...)``
installs, in the child only: a fake ``torch_npu`` (device name, SoC number, CANN/driver
answers, queries named in ``raise_on`` raising), a fake ``npu-smi`` first on PATH, and fake
``version.info`` / ``ascend_toolkit_install.info`` files under a temporary Ascend root.
The real machine's files and tools are hidden while it is active, so a spoofed case means
the same thing on an Ascend runner as on a laptop. The parent never sees any of it.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import shutil
import sys
import tempfile
import types
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

#: names accepted in ``raise_on``
RAISABLE = ("import", "get_soc_version", "get_device_name", "get_cann_version", "npu-smi")

_NPU_SMI = """#!{python}
import json, sys
spec = json.load(open({spec!r}))
if spec.get("raise"):
    sys.stderr.write("npu-smi: Permission denied (spoofed failure)\\n"); sys.exit(1)
out = spec.get("output")
if out is None:
    sys.stderr.write("npu-smi: command not found (spoofed: absent)\\n"); sys.exit(127)
if isinstance(out, dict):
    key = " ".join(sys.argv[1:])
    if key not in out:
        sys.stderr.write("Error: no spoofed output for '%s'\\n" % key); sys.exit(1)
    out = out[key]
sys.stdout.write(out)
"""


@dataclass(frozen=True)
class NpuSpoof:
    """What the fake machine answers. ``None`` means: that source is absent (a torch_npu
    function missing, no npu-smi, no file). ``npu_smi_output`` is printed for every
    invocation, or is a dict from the joined arguments (``"info -t board -i 0"``) to output."""

    device_name: str | None = None
    soc_version: int | None = None
    cann_version: str | None = None
    driver_version: str | None = None
    npu_smi_output: str | dict[str, str] | None = None
    version_info: str | None = None
    install_info: str | None = None
    raise_on: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        bad = [r for r in self.raise_on if r not in RAISABLE]
        if bad:
            raise ValueError(f"NpuSpoof(raise_on={bad!r}): unknown; use any of {RAISABLE}")

    def _fake_torch_npu(self) -> types.ModuleType:
        spoof = self

        def answer(name: str, value: object) -> object:
            if name in spoof.raise_on:
                raise RuntimeError(f"{name} failed (spoofed): device query error 507033")
            return value

        mod = types.ModuleType("torch_npu")
        mod.__doc__ = "fake torch_npu installed by harness.hardware.spoof.NpuSpoof"
        npu = types.ModuleType("torch_npu.npu")
        npu.device_count = lambda: 1  # type: ignore[attr-defined]
        npu.is_initialized = lambda: False  # type: ignore[attr-defined]
        if self.soc_version is not None:
            npu.get_soc_version = lambda: answer("get_soc_version", self.soc_version)  # type: ignore[attr-defined]
        if self.device_name is not None:
            npu.get_device_name = lambda device=None: answer("get_device_name", self.device_name)  # type: ignore[attr-defined]
        utils = types.ModuleType("torch_npu.utils")

        def get_cann_version(module: str = "CANN") -> object:
            value = self.driver_version if module == "DRIVER" else self.cann_version
            return answer("get_cann_version", value or "")  # "" below CANN 8.1.RC1

        utils.get_cann_version = get_cann_version  # type: ignore[attr-defined]
        mod.npu, mod.utils = npu, utils  # type: ignore[attr-defined]
        return mod

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Child side: install the fake machine for the duration of the block."""
        tmp = Path(tempfile.mkdtemp(prefix="npu-spoof-"))
        saved_env = {k: os.environ.get(k) for k in ("PATH", "ASCEND_HOME_PATH",
                                                    "HARNESS_ASCEND_ROOT")}
        saved_modules = {k: v for k, v in sys.modules.items()
                         if k == "torch_npu" or k.startswith("torch_npu.")}
        saved_path = list(sys.path)
        try:
            for name in saved_modules:
                del sys.modules[name]
            if "import" in self.raise_on:
                broken = tmp / "site" / "torch_npu"
                broken.mkdir(parents=True)
                (broken / "__init__.py").write_text(
                    "raise ImportError('libascendcl.so: cannot open shared object file "
                    "(spoofed import failure)')\n")
                sys.path.insert(0, str(tmp / "site"))
            else:
                fake = self._fake_torch_npu()
                sys.modules.update({"torch_npu": fake, "torch_npu.npu": fake.npu,
                                    "torch_npu.utils": fake.utils})
            bindir = tmp / "bin"
            bindir.mkdir()
            spec = bindir / "npu-smi.json"
            spec.write_text(json.dumps({"output": self.npu_smi_output,
                                        "raise": "npu-smi" in self.raise_on}))
            script = bindir / "npu-smi"
            script.write_text(_NPU_SMI.format(python=sys.executable, spec=str(spec)))
            script.chmod(0o755)
            os.environ["PATH"] = f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"
            root = tmp / "ascend"
            os.environ["HARNESS_ASCEND_ROOT"] = str(root)
            os.environ.pop("ASCEND_HOME_PATH", None)
            if self.version_info is not None:
                (root / "driver").mkdir(parents=True)
                (root / "driver" / "version.info").write_text(self.version_info)
            if self.install_info is not None:
                home = tmp / "toolkit"
                arch = home / f"{platform.machine()}-linux"
                arch.mkdir(parents=True)
                (arch / "ascend_toolkit_install.info").write_text(self.install_info)
                os.environ["ASCEND_HOME_PATH"] = str(home)
            yield None
        finally:
            for key, value in saved_env.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value
            for name in [k for k in sys.modules if k == "torch_npu" or k.startswith("torch_npu.")]:
                del sys.modules[name]
            sys.modules.update(saved_modules)
            sys.path[:] = saved_path
            shutil.rmtree(tmp, ignore_errors=True)
