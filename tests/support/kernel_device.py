"""Where a `-m gpu` kernel test runs: the GPU, or the CPU under Triton's interpreter (TRITON_INTERPRET=1).
Missing Triton or CUDA fails the test (never a skip): these tests only run under `-m gpu`."""

from __future__ import annotations

import pytest
import torch


def kernel_device() -> str:
    from kernels._dispatch import HAS_TRITON, INTERPRET

    if not HAS_TRITON:
        pytest.fail("the gpu tests need Triton: run them on the device machine (make test-gpu)")
    if INTERPRET:
        return "cpu"
    if not torch.cuda.is_available():
        pytest.fail("the gpu tests need a CUDA device (or TRITON_INTERPRET=1)")
    return "cuda"
