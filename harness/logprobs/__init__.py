"""Cross-batch-size logprob bit-equality: the check engine, the built-in TinyDecoder source
and the vLLM adapter (``harness.logprobs.vllm_source``)."""

from harness.logprobs.engine import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_SLOTS,
    InvarianceReport,
    LogprobSource,
    Mismatch,
    check_batch_invariance,
    compare_bits,
)
from harness.logprobs.tiny import TinyConfig, TinyDecoder

__all__ = [
    "DEFAULT_BATCH_SIZES", "DEFAULT_SLOTS", "InvarianceReport", "LogprobSource", "Mismatch",
    "TinyConfig", "TinyDecoder", "check_batch_invariance", "compare_bits",
]
