"""Shared comparison helper for the kernel reference tests (fla-style relative RMS + absolute floor)."""

from __future__ import annotations

import pytest
import torch
from kernel_device import kernel_device


def _assert_close(
    name: str, actual: torch.Tensor, expected: torch.Tensor, ratio: float = 1e-5, atol: float = 1e-6
) -> None:
    actual, expected = actual.double(), expected.double()
    assert actual.shape == expected.shape, f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    err = (actual - expected).abs()
    rms_ratio = (err.pow(2).mean().sqrt() / expected.pow(2).mean().sqrt().clamp_min(1e-30)).item()
    max_abs = err.max().item() if err.numel() else 0.0
    assert rms_ratio <= ratio or max_abs <= atol, (
        f"{name}: rms ratio {rms_ratio:.3e} (limit {ratio:.0e}), max abs {max_abs:.3e}"
    )


@pytest.fixture
def assert_close():
    return _assert_close


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(1234)


@pytest.fixture
def device() -> str:
    """Where the Triton tests run: the GPU, or the CPU under Triton's interpreter (TRITON_INTERPRET=1)."""
    return kernel_device()
