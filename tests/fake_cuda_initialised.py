"""Preload module for forkserver tests: makes torch report an initialised CUDA context."""

import torch

torch.cuda.is_initialized = lambda: True
