"""RMSNorm references against a per-row Python loop."""

from __future__ import annotations

import math

import pytest
import torch

from kernels.norm import gated_rms_norm_ref, rms_norm_ref


def _naive_rms(row: list[float], eps: float) -> float:
    return math.sqrt(sum(v * v for v in row) / len(row) + eps)


@pytest.mark.parametrize("shape", [(63, 60), (5, 3, 20)])
def test_rms_norm_is_zero_centred_weight_over_rms(shape, assert_close):
    x, w = torch.randn(shape), torch.randn(shape[-1])
    expected = torch.empty(shape)
    flat_x, flat_e = x.reshape(-1, shape[-1]), expected.view(-1, shape[-1])
    for r in range(flat_x.shape[0]):
        rms = _naive_rms(flat_x[r].tolist(), 1e-6)
        for c in range(shape[-1]):
            flat_e[r, c] = flat_x[r, c].item() / rms * (1.0 + w[c].item())
    assert_close("rms_norm", rms_norm_ref(x, w, 1e-6), expected)


def test_rms_norm_keeps_input_dtype():
    x = torch.randn(7, 20, dtype=torch.bfloat16)
    assert rms_norm_ref(x, torch.zeros(20), 1e-6).dtype == torch.bfloat16


def test_gated_rms_norm_uses_plain_weight_and_silu_gate(assert_close):
    x, gate, w = torch.randn(63, 20), torch.randn(63, 20), torch.rand(20) + 0.5
    expected = torch.empty(63, 20)
    for r in range(63):
        rms = _naive_rms(x[r].tolist(), 1e-5)
        for c in range(20):
            z = gate[r, c].item()
            expected[r, c] = x[r, c].item() / rms * w[c].item() * z / (1.0 + math.exp(-z))
    assert_close("gated_rms_norm", gated_rms_norm_ref(x, gate, w, 1e-5), expected)
