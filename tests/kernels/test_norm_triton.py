"""Triton RMSNorm launchers vs their references (GPU; or CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels.norm import (
    _num_heads,
    add_rms_norm,
    add_rms_norm_ref,
    gated_rms_norm,
    gated_rms_norm_ref,
    rms_norm,
    rms_norm_ref,
)

pytestmark = pytest.mark.gpu

# bf16 output: the kernel and the reference differ by at most an output rounding (rel RMS ~1e-3).
RATIO, ATOL = 4e-3, 1.6e-2


@pytest.mark.parametrize(("rows", "dim"), [(1, 5120), (8, 5120), (77, 5120), (5, 2048), (3, 100), (300, 24)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rms_norm_and_add(rows, dim, dtype, device, assert_close):
    x = torch.randn(rows, dim, device=device, dtype=dtype) * 3
    residual = torch.randn(rows, dim, device=device, dtype=dtype)
    weight = torch.randn(dim, device=device, dtype=dtype) * 0.1
    ratio = RATIO if dtype == torch.bfloat16 else 1e-5
    assert_close("rms_norm", rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), ratio, ATOL)
    out, summed = add_rms_norm(x, residual, weight, 1e-6)
    ref_out, ref_summed = add_rms_norm_ref(x, residual, weight, 1e-6)
    assert torch.equal(summed, ref_summed), "the residual sum must be bit-exact"
    assert_close("add_rms_norm", out, ref_out, ratio, ATOL)


@pytest.mark.parametrize(("tokens", "heads", "dim"), [(1, 48, 128), (8, 48, 128), (37, 32, 128), (5, 3, 60)])
def test_gated_rms_norm_per_head(tokens, heads, dim, device, assert_close):
    x = torch.randn(tokens, heads, dim, device=device, dtype=torch.bfloat16)
    gate = torch.randn(tokens, heads, dim, device=device, dtype=torch.bfloat16) * 2
    weight = 1 + torch.randn(dim, device=device) * 0.1
    ref = gated_rms_norm_ref(x, gate, weight, 1e-6)
    assert_close("gated_rms_norm", gated_rms_norm(x, gate, weight, 1e-6), ref, RATIO, ATOL)


def test_strided_input_rows(device, assert_close):
    base = torch.randn(9, 2 * 384, device=device, dtype=torch.bfloat16)
    x = base[:, 384:]  # row stride 768, unit stride along D
    weight = torch.randn(384, device=device) * 0.1
    assert_close("strided", rms_norm(x, weight, 1e-6), rms_norm_ref(x, weight, 1e-6), RATIO, ATOL)


@pytest.mark.parametrize(("tokens", "heads", "dim"), [(1, 4, 64), (5, 3, 64), (7, 2, 40), (3, 1, 48)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_head_views_of_a_fused_row(tokens, heads, dim, dtype, device, assert_close):
    """q/k/z as the fused projections hand them over: [T, H, D] views of a wider [T, N] row (token stride N,
    head stride 2D for the query next to its gate, D for the key), normalised in place (no copy)."""
    q_size, kv_size, z_size = 2 * heads * dim, heads * dim, heads * dim
    fused = torch.randn(tokens, q_size + kv_size + z_size + 5, device=device, dtype=dtype) * 2
    q, k, z, _ = fused.split([q_size, kv_size, z_size, 5], dim=-1)
    query = q.view(tokens, heads, 2 * dim)[..., :dim]  # strides (N, 2D, 1)
    key = k.view(tokens, heads, dim)  # strides (N, D, 1)
    gate = z.view(tokens, heads, dim)
    weight = torch.randn(dim, device=device) * 0.1
    assert _num_heads(query) == _num_heads(key) == (heads if tokens > 1 and heads > 1 else 1)
    ratio, atol = (RATIO, ATOL) if dtype == torch.bfloat16 else (1e-5, 1e-5)
    for name, x in (("query", query), ("key", key)):
        got = rms_norm(x, weight, 1e-6)
        assert got.is_contiguous() and got.shape == x.shape
        assert torch.equal(got, rms_norm(x.contiguous(), weight, 1e-6)), f"{name}: strided != contiguous"
        assert_close(name, got, rms_norm_ref(x, weight, 1e-6), ratio, atol)
    core = torch.randn(tokens, heads, dim, device=device, dtype=dtype)
    norm_weight = 1 + torch.randn(dim, device=device) * 0.1
    for name, x, g in (("gate strided", core, gate), ("both strided", key, gate), ("x strided", key, core)):
        got = gated_rms_norm(x, g, norm_weight, 1e-6)
        same = gated_rms_norm(x.contiguous(), g.contiguous(), norm_weight, 1e-6)
        assert torch.equal(got, same), f"{name}: strided != contiguous"
        assert_close(name, got, gated_rms_norm_ref(x, g, norm_weight, 1e-6), ratio, atol)
