"""Fake vLLM batch_invariant (facts file, section 1): CUDA only; other platforms raise
NotImplementedError before changing global state. FAKE_VLLM_PLATFORM=cuda pretends."""

import os

import torch

_batch_invariant_LIB = None


def enable_batch_invariant_mode():
    global _batch_invariant_LIB
    if os.environ.get("FAKE_VLLM_PLATFORM") != "cuda":
        raise NotImplementedError("batch invariance is only implemented for CUDA and XPU")
    # the real one registers Triton kernels on aten ops here; the library object is what the
    # switch check looks at
    _batch_invariant_LIB = torch.library.Library("aten", "IMPL")


def init_batch_invariance():
    if os.environ.get("VLLM_BATCH_INVARIANT", "0") != "0":
        enable_batch_invariant_mode()
