"""The SiLU-gated activation and the sigmoid output gate: each reference against the exact expression, against
the eager expression it replaced, and each launcher off CUDA (it runs the reference)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kernels._dispatch
from kernels.activation import sigmoid_gate_mul, sigmoid_gate_mul_ref, silu_mul, silu_mul_ref


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


def _attention_gate_view(tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype):
    """The gate exactly as GatedAttention makes it: the q | gate part of a fused [T, 2HD + 2H_kvD] qkv
    projection output, viewed [T, H, 2D] and split; the second half is the gate (strides (row, 2D, 1))."""
    fused = torch.randn(tokens, 2 * heads * head_dim + 2 * kv_heads * head_dim, dtype=torch.float32) * 4
    q = fused.to(dtype).split([2 * heads * head_dim, 2 * kv_heads * head_dim], dim=-1)[0]
    gate = q.view(tokens, heads, 2 * head_dim).chunk(2, dim=-1)[1]
    assert gate.stride()[1:] == (2 * head_dim, 1) and not gate.is_contiguous()
    assert tokens == 1 or gate.stride(0) == fused.shape[1]  # (one token: view() picks any token stride)
    return gate


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32])
@pytest.mark.parametrize(("tokens", "heads", "head_dim"), [(1, 24, 256), (3, 2, 60), (37, 5, 64)])
def test_sigmoid_gate_mul_ref_is_the_exact_product_rounded_once(dtype, tokens, heads, head_dim):
    """The reference equals x * sigmoid(gate) computed in float64 and rounded once to x's dtype, except where
    the float32 intermediate lands on the other side of a rounding boundary (then one ulp, rarely)."""
    gate = _attention_gate_view(tokens, heads, 4, head_dim, dtype)
    x = torch.randn(tokens, heads, head_dim).to(dtype)
    ref = sigmoid_gate_mul_ref(x, gate)
    assert ref.shape == (tokens, heads, head_dim) and ref.dtype == dtype and ref.is_contiguous()
    exact = (x.double() * torch.sigmoid(gate.double())).to(dtype)
    ulp = {torch.bfloat16: 2.0**-7, torch.float16: 2.0**-10, torch.float32: 2.0**-22}[dtype]
    diff = (ref.double() - exact.double()).abs()
    assert (diff <= exact.double().abs() * ulp + 2.0**-133).all(), f"{dtype}: more than one ulp from exact"
    if dtype != torch.float32:
        assert (ref != exact).float().mean().item() < 0.01, "the fp32 intermediate rounds once, almost always"


def test_sigmoid_gate_mul_ref_per_element():
    x, gate = torch.randn(3, 2, 5), torch.randn(3, 2, 5) * 4
    expected = torch.empty(3, 2, 5)
    for index in torch.cartesian_prod(torch.arange(3), torch.arange(2), torch.arange(5)).tolist():
        t, h, d = index
        expected[t, h, d] = x[t, h, d].item() / (1.0 + math.exp(-gate[t, h, d].item()))
    assert torch.allclose(sigmoid_gate_mul_ref(x, gate), expected, rtol=1e-6, atol=0.0)


def test_sigmoid_gate_fp32_reference_equals_the_eager_expression():
    """What keeps the model's fp32 CPU parity with HF: in fp32 the reference is attention's old expression."""
    gate = _attention_gate_view(6, 4, 2, 32, torch.float32)
    out = torch.randn(6, 4, 32)
    assert torch.equal(sigmoid_gate_mul_ref(out, gate), out * torch.sigmoid(gate.float()).to(out.dtype))


def test_sigmoid_gate_bf16_rounds_once_and_is_within_one_ulp_of_the_eager_expression():
    """The eager bf16 expression rounds the sigmoid to bf16 before the product; the reference rounds once.
    The two differ by at most one bf16 ulp, and the single rounding is the closer to the exact value."""
    gate = _attention_gate_view(64, 8, 2, 64, torch.bfloat16)
    out = torch.randn(64, 8, 64).bfloat16()
    ref = sigmoid_gate_mul_ref(out, gate)
    eager = out * torch.sigmoid(gate.float()).to(out.dtype)
    exact = out.double() * torch.sigmoid(gate.double())
    diff = (ref.double() - eager.double()).abs()
    assert (diff <= ref.double().abs() * 2.0**-7).all(), "more than one bf16 ulp from the eager expression"
    assert (ref.double() - exact).abs().sum() < (eager.double() - exact).abs().sum()


def test_sigmoid_gate_launcher_off_cuda_is_the_reference(monkeypatch):
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", False)  # the interpreter venv would run the kernel
    gate = _attention_gate_view(5, 24, 4, 16, torch.bfloat16)
    x = torch.randn(5, 24, 16, dtype=torch.bfloat16)
    out = sigmoid_gate_mul(x, gate)
    assert torch.equal(out, sigmoid_gate_mul_ref(x, gate)) and out.is_contiguous()
    x_t = torch.randn(24, 5, 16, dtype=torch.bfloat16).transpose(0, 1)  # token and head strides swapped
    out_t = sigmoid_gate_mul(x_t, gate)
    assert torch.equal(out_t, sigmoid_gate_mul_ref(x_t, gate)) and out_t.is_contiguous()


def test_sigmoid_gate_launcher_checks_its_inputs():
    x = torch.randn(2, 3, 8)
    with pytest.raises(AssertionError, match="gate"):
        sigmoid_gate_mul(x, torch.randn(2, 3, 4))
    with pytest.raises(AssertionError, match="dtype|!="):
        sigmoid_gate_mul(x, x.bfloat16())
    with pytest.raises(AssertionError, match="unit stride"):
        sigmoid_gate_mul(x, torch.randn(2, 3, 16)[..., ::2])
    with pytest.raises(AssertionError, match=r"\[T, H, D\]"):
        sigmoid_gate_mul(x.view(6, 8), x.view(6, 8))
