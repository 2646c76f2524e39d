"""The SiLU-gated activation reference against a per-element Python loop, against the eager expression it
replaced, and the launcher off CUDA (it runs the reference)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kernels._dispatch
from kernels.activation import silu_mul, silu_mul_ref


def test_silu_mul_ref_is_silu_of_gate_times_up(assert_close):
    gate, up = torch.randn(7, 13) * 4, torch.randn(7, 13)
    expected = torch.empty(7, 13)
    for r in range(7):
        for c in range(13):
            z = gate[r, c].item()
            expected[r, c] = z / (1.0 + math.exp(-z)) * up[r, c].item()
    assert_close("silu_mul_ref", silu_mul_ref(gate, up), expected)


def test_fp32_reference_equals_the_eager_expression():
    """What keeps the model's fp32 CPU parity with HF: in fp32 the reference is the old ``F.silu(g) * u``."""
    gate, up = torch.randn(5, 3, 40) * 3, torch.randn(5, 3, 40)
    assert torch.equal(silu_mul_ref(gate, up), F.silu(gate) * up)


def test_bf16_rounds_once_and_is_within_one_ulp_of_the_eager_expression():
    """The eager bf16 ``F.silu(g) * u`` rounds the silu to bf16 before the product; the reference rounds once.
    The two differ by at most one bf16 ulp, and the single rounding is the closer to the exact value."""
    gate = (torch.randn(64, 512) * 3).bfloat16()
    up = torch.randn(64, 512).bfloat16()
    ref = silu_mul_ref(gate, up)
    assert ref.dtype == torch.bfloat16
    exact = F.silu(gate.double()) * up.double()
    eager = F.silu(gate) * up
    diff = (ref.double() - eager.double()).abs()
    assert (diff <= ref.double().abs() * 2.0**-7).all(), "more than one bf16 ulp from the eager expression"
    assert (ref.double() - exact).abs().sum() < (eager.double() - exact).abs().sum()


def test_launcher_off_cuda_is_the_reference(monkeypatch):
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", False)  # the interpreter venv would run the kernel
    base = torch.randn(6, 2 * 24, dtype=torch.bfloat16)
    gate, up = base.chunk(2, dim=-1)  # the two halves of one tensor: row stride 48
    assert torch.equal(silu_mul(gate, up), silu_mul_ref(gate, up))
    gate32, up32 = torch.randn(3, 5), torch.randn(3, 5)
    assert torch.equal(silu_mul(gate32, up32), silu_mul_ref(gate32, up32))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_keeps_shape_and_dtype(dtype):
    gate, up = torch.randn(2, 3, 7, dtype=dtype), torch.randn(2, 3, 7, dtype=dtype)
    out = silu_mul_ref(gate, up)
    assert out.shape == (2, 3, 7) and out.dtype == dtype
