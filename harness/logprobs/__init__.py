"""Cross-batch-size logprob bit-equality: the batch-size check
(``harness.logprobs.invariance_check``; "engine" in this family always means a vLLM engine),
the built-in TinyDecoder source and the vLLM adapter (``harness.logprobs.vllm_source``);
the decode-versus-prefill and repeat properties (``harness.logprobs.properties``).

Layer: a check family. May import the other families' targets (``harness.invariance``),
the isolation core and the stack layer, never the pytest face or the report.
"""

from harness.logprobs.invariance_check import (
    DEFAULT_BATCH_SIZES,
    DEFAULT_SLOTS,
    InvarianceReport,
    LogprobSource,
    Mismatch,
    check_batch_invariance,
    compare_bits,
)
from harness.logprobs.properties import check_decode_matches_prefill, check_repeatable
from harness.logprobs.tiny import TinyConfig, TinyDecoder

__all__ = [
    "DEFAULT_BATCH_SIZES", "DEFAULT_SLOTS", "InvarianceReport", "LogprobSource", "Mismatch",
    "TinyConfig", "TinyDecoder", "check_batch_invariance", "check_decode_matches_prefill",
    "check_repeatable", "compare_bits",
]
