"""Fake of the verl-family hardware helpers, as the facts file describes them (substring
name rules, so plain "Ascend910B" reads as A2; any torch_npu failure gives NONE)."""

import glob
import os
import re
import subprocess
from enum import IntEnum

from packaging.version import Version


class AscendHardwareVersion(IntEnum):
    NONE = 0
    A2 = 2
    A3 = 3
    A5 = 5
    MAX_VERSION = 999


def _hardware():
    try:
        import torch_npu

        name = torch_npu.npu.get_device_name()
    except Exception:
        return AscendHardwareVersion.NONE
    if "Ascend910_95" in name or "Ascend950" in name:
        return AscendHardwareVersion.A5
    if "Ascend910_93" in name:
        return AscendHardwareVersion.A3
    if "Ascend910B" in name or "A2G" in name:
        return AscendHardwareVersion.A2
    return AscendHardwareVersion.MAX_VERSION


def get_npu_versions():
    out = subprocess.run(["npu-smi", "info", "-t", "board", "-i", "0"], capture_output=True,
                         text=True, check=False).stdout
    m = re.search(r"Software Version\s*:\s*(\S+)", out)
    software = m.group(1) if m else None
    cann = None
    home = os.environ.get("ASCEND_HOME_PATH", "/usr/local/Ascend/ascend-toolkit/latest")
    for path in glob.glob(os.path.join(home, "*-linux", "ascend_toolkit_install.info")):
        with open(path) as fh:
            for line in fh:
                if line.startswith("version="):
                    cann = line.split("=", 1)[1].strip().lower()
    return _hardware(), software, cann


def check_ipc_version_support(software_version, cann_version):
    def trim(v):
        v = v.lower()
        m = re.match(r"(\d+\.\d+)(?=\.t)|(\d+\.\d+(\.rc\d+|\.\d+)?)", v)
        if not m:
            raise RuntimeError(f"cannot parse version {v!r}")
        return Version(m.group(0))

    return trim(software_version) >= Version("25.3.rc1") and trim(cann_version) >= Version("8.3.rc1")
