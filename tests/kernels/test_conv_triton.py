"""Triton causal conv1d decode step vs its reference (GPU; or CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels.conv import causal_conv1d_decode, causal_conv1d_decode_ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(
    ("batch", "channels", "kernel"), [(1, 10240, 4), (8, 10240, 4), (3, 1000, 4), (5, 77, 2)]
)
@pytest.mark.parametrize("activation", ["silu", None])
def test_conv_decode_matches_reference_and_updates_slots(
    batch, channels, kernel, activation, device, assert_close
):
    num_slots = batch + 3
    x = torch.randn(batch, channels, device=device, dtype=torch.bfloat16)
    weight = torch.randn(channels, kernel, device=device, dtype=torch.bfloat16) * 0.5
    pool = torch.randn(num_slots, channels, kernel - 1, device=device, dtype=torch.bfloat16)
    slots = torch.randperm(num_slots, device=device)[:batch]
    keep = torch.rand(batch, device=device) > 0.3
    if batch > 2:
        slots[1] = -1  # a padding row (CUDA-graph batch padding)
    ref_pool = pool.clone()
    expected = causal_conv1d_decode_ref(x, weight, ref_pool, slots, keep, activation)
    out = causal_conv1d_decode(x, weight, pool, slots, keep, activation)
    # Same fp32 sum order up to FMA contraction: one bf16 rounding apart at most.
    assert_close("out", out, expected, 4e-3, 1.6e-2)
    assert torch.equal(pool, ref_pool), "conv state pool (incl. untouched slots) must be bit-exact"
    if batch > 2:
        assert torch.all(out[1] == 0)


def test_conv_decode_strided_rows(device, assert_close):
    base = torch.randn(4, 2 * 640, device=device, dtype=torch.bfloat16)
    x = base[:, :640]
    weight = torch.randn(640, 4, device=device, dtype=torch.bfloat16)
    pool = torch.randn(6, 640, 3, device=device, dtype=torch.bfloat16)
    slots, keep = torch.tensor([5, 0, 2, 3], device=device), torch.ones(4, dtype=torch.bool, device=device)
    ref_pool = pool.clone()
    expected = causal_conv1d_decode_ref(x, weight, ref_pool, slots, keep)
    assert_close("out", causal_conv1d_decode(x, weight, pool, slots, keep), expected, 4e-3, 1.6e-2)
    assert torch.equal(pool, ref_pool)
