"""Preload module for forkserver tests: makes torch report an initialised NPU (torch.npu)."""

import types

import torch

torch.npu = types.SimpleNamespace(is_initialized=lambda: True)
