"""Fake of vllm-ascend's SoC mapping, per the facts file: A3 ends at 255 (torch_npu: 256)."""


def device_type_from_soc_version(soc_version):
    if 220 <= soc_version <= 225:
        return "A2"
    if 250 <= soc_version <= 255:
        return "A3"
    if 200 <= soc_version <= 205:
        return "_310P"
    if soc_version == 260:
        return "A5"
    raise RuntimeError(f"Can not support soc_version: {soc_version}")
