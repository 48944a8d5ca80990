"""Fake vllm_ascend (facts file, section 1)."""
