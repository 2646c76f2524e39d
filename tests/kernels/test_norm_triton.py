"""Triton RMSNorm launchers vs their references (GPU; or CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels.norm import (
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
