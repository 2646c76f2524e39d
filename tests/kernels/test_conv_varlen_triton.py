"""Triton varlen causal conv1d (prefill) vs its reference (GPU; or CPU under TRITON_INTERPRET=1).

Output within one bf16 rounding of the reference; the conv state pool (slots written and slots left
alone) bit-exact, since the new state is a pure copy of old state entries and input rows.
"""

from __future__ import annotations

import pytest
import torch

from kernels._dispatch import INTERPRET
from kernels.conv import (
    causal_conv1d_varlen,
    causal_conv1d_varlen_ref,
    causal_conv1d_varlen_split,
    causal_conv1d_varlen_split_ref,
)

pytestmark = pytest.mark.gpu

# Same fp32 products as the reference, summed in another order (FMA): one output rounding apart at most.
# NOTE: Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest), half an ulp of bias on
# every output, hence its looser bf16 ratio.
RATIO = {torch.bfloat16: 1e-2 if INTERPRET else 4e-3, torch.float32: 1e-5}
ATOL = {torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def _batch(
    lens: list[int], keep: list[bool], channels: int, kernel: int, dtype, device, x_layout="contiguous"
):
    """x [T, C] in the given memory layout, weight, a state pool with spare slots, cu_seqlens, slots, keep."""
    num_tokens = sum(lens)
    if x_layout == "row_stride":  # a column slice of a wider projection (row stride > C)
        x = torch.randn(num_tokens, channels + 40, device=device, dtype=dtype)[:, 24 : 24 + channels]
    elif x_layout == "transposed":  # channel stride T, token stride 1
        x = torch.randn(channels, num_tokens, device=device, dtype=dtype).t()
    else:
        x = torch.randn(num_tokens, channels, device=device, dtype=dtype)
    weight = torch.randn(channels, kernel, device=device, dtype=dtype) * 0.5
    num_slots = len(lens) + 3
    pool = torch.randn(num_slots, channels, kernel - 1, device=device, dtype=dtype)
    cu = torch.tensor([0, *torch.tensor(lens).cumsum(0).tolist()], dtype=torch.int32, device=device)
    slots = torch.randperm(num_slots, device=device)[: len(lens)]
    has_initial = torch.tensor(keep, dtype=torch.bool, device=device)
    return x, weight, pool, cu, slots, has_initial


def _check(x, weight, pool, cu, slots, keep, activation, assert_close):
    ref_pool = pool.clone()
    expected = causal_conv1d_varlen_ref(x, weight, ref_pool, cu, slots, keep, activation)
    out = causal_conv1d_varlen(x, weight, pool, cu, slots, keep, activation)
    assert out.is_contiguous() and out.dtype == x.dtype
    assert_close("out", out, expected, RATIO[x.dtype], ATOL[x.dtype])
    assert torch.equal(pool, ref_pool), "conv state pool (written and untouched slots) must be bit-exact"


@pytest.mark.parametrize(
    ("lens", "keep"),
    [
        ([1, 2, 3, 5, 64, 300], [True] * 6),
        ([1, 2, 3, 5, 64, 300], [False] * 6),
        ([300, 3, 1, 64, 2, 5], [True, False, True, True, False, True]),
        ([2], [True]),
        ([1, 1, 1], [True, False, True]),
        ([33, 0, 31, 32], [True, True, False, True]),  # an empty sequence and tile-boundary lengths
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_varlen_matches_reference_and_writes_states(lens, keep, dtype, device, assert_close):
    _check(*_batch(lens, keep, 77, 4, dtype, device), "silu", assert_close)


@pytest.mark.parametrize("x_layout", ["row_stride", "transposed"])
@pytest.mark.parametrize("activation", ["silu", None])
def test_varlen_strided_x(x_layout, activation, device, assert_close):
    lens, keep = [5, 1, 70, 3], [True, False, True, True]
    _check(*_batch(lens, keep, 96, 4, torch.bfloat16, device, x_layout), activation, assert_close)


@pytest.mark.parametrize("kernel", [2, 3])
def test_varlen_other_kernel_widths(kernel, device, assert_close):
    _check(*_batch([1, 2, 40], [True, True, False], 50, kernel, torch.float32, device), "silu", assert_close)


def test_chunked_sequence_equals_whole(device, assert_close):
    """A sequence fed as chunks of 1, 2, 3, 5 and 64 tokens gives the unchunked output and final state:
    the short chunks' states mix old state entries with new tokens."""
    channels, lens = 64, [1, 2, 3, 5, 64]
    x, weight, pool, _, _, _ = _batch([sum(lens)], [True], channels, 4, torch.float32, device)
    slot = torch.tensor([1], device=device)
    whole_pool = pool.clone()
    cu_whole = torch.tensor([0, sum(lens)], dtype=torch.int32, device=device)
    whole = causal_conv1d_varlen(x, weight, whole_pool, cu_whole, slot, torch.tensor([True], device=device))
    parts, start = [], 0
    for length in lens:
        cu = torch.tensor([0, length], dtype=torch.int32, device=device)
        keep = torch.tensor([True], device=device)
        parts.append(causal_conv1d_varlen(x[start : start + length], weight, pool, cu, slot, keep))
        start += length
    assert_close("chunked", torch.cat(parts), whole, RATIO[torch.float32], ATOL[torch.float32])
    assert torch.equal(pool, whole_pool)


@pytest.mark.parametrize(
    ("split_sizes", "channels"),
    [((32, 32, 64), 128), ((16, 16, 45), 77), ((16, 48), 64), ((10, 10, 20), 40), ((8, 8, 8, 8), 32)],
)
def test_varlen_split_outputs(split_sizes, channels, device, assert_close):
    """q | k | v groups written straight into contiguous tensors (16-aligned split points), or split after
    the kernel (odd points, more than three groups)."""
    lens, keep = [3, 1, 40, 2], [True, False, True, True]
    x, weight, pool, cu, slots, has_initial = _batch(
        lens, keep, channels, 4, torch.bfloat16, device, "row_stride"
    )
    ref_pool = pool.clone()
    expected = causal_conv1d_varlen_split_ref(x, weight, ref_pool, cu, slots, has_initial, split_sizes)
    parts = causal_conv1d_varlen_split(x, weight, pool, cu, slots, has_initial, split_sizes)
    assert len(parts) == len(split_sizes)
    for i, (part, ref) in enumerate(zip(parts, expected, strict=True)):
        assert part.is_contiguous() and part.shape == ref.shape
        assert_close(f"part {i}", part, ref, RATIO[torch.bfloat16], ATOL[torch.bfloat16])
    assert torch.equal(pool, ref_pool)


@pytest.mark.parametrize("lens", [[7680], [4000, 3, 1, 2, 3674]])
def test_varlen_27b_geometry(lens, device, assert_close):
    """The Qwen3.6-27B prefill shape: C = 10240 (q | k | v = 2048 | 2048 | 6144), K = 4."""
    if device != "cuda":
        pytest.skip("real-geometry size: too slow for the interpreter")
    keep = [i % 2 == 0 for i in range(len(lens))]
    x, weight, pool, cu, slots, has_initial = _batch(lens, keep, 10240, 4, torch.bfloat16, device)
    _check(x, weight, pool.clone(), cu, slots, has_initial, "silu", assert_close)
    ref_pool = pool.clone()
    expected = causal_conv1d_varlen_split_ref(x, weight, ref_pool, cu, slots, has_initial, (2048, 2048, 6144))
    parts = causal_conv1d_varlen_split(x, weight, pool, cu, slots, has_initial, (2048, 2048, 6144))
    for i, (part, ref) in enumerate(zip(parts, expected, strict=True)):
        assert_close(f"part {i}", part, ref, RATIO[torch.bfloat16], ATOL[torch.bfloat16])
    assert torch.equal(pool, ref_pool)
