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


@pytest.mark.parametrize(("batch", "channels"), [(1, 10240), (5, 77)])
def test_conv_decode_out_of_place_matches_reference(batch, channels, device, assert_close):
    """out_slots (columns of a slot table, as the speculative verify passes them): the state read from
    state_slots and written to out_slots, bit-exact with the reference; padding rows (-1) and a row whose out
    slot is -1 write nothing; the source slots keep their state. fp32: the slots are under test, and Triton
    3.6's interpreter truncates fp32 -> bf16 (the GPU rounds), which the bf16 tests' tolerances do not take."""
    kernel, num_slots = 4, 3 * batch + 2
    x = torch.randn(batch, channels, device=device)
    weight = torch.randn(channels, kernel, device=device) * 0.5
    pool = torch.randn(num_slots, channels, kernel - 1, device=device)
    table = torch.randperm(num_slots, device=device)[: 3 * batch].view(batch, 3)  # [B, 3]: in, out, spare
    slots, out_slots = table[:, 0], table[:, 1]
    keep = torch.rand(batch, device=device) > 0.3
    if batch > 2:
        table[1, :2] = -1  # a padding row: -1 in and out
        table[2, 1] = -1  # a row that writes no state
    before = pool.clone()
    ref_pool = pool.clone()
    expected = causal_conv1d_decode_ref(x, weight, ref_pool, slots, keep, "silu", out_slots)
    out = causal_conv1d_decode(x, weight, pool, slots, keep, "silu", out_slots)
    assert_close("out", out, expected, 1e-5, 1e-5)
    assert torch.equal(pool, ref_pool), "conv state pool (incl. source and untouched slots) must be bit-exact"
    written = [s for s in out_slots.tolist() if s >= 0]
    kept = [s for s in range(num_slots) if s not in written]
    assert torch.equal(pool[kept], before[kept]), "only the out slots may change"
    assert not torch.equal(pool[written], before[written])
