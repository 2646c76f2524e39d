"""Paged KV store (bit-exact, bf16 and int8) and split-K paged decode attention (float and int8 KV) vs their
references, and decode's batch invariance: a sequence's output is bitwise the same alone or batched; paged
prefill attention (float and int8 KV) vs its reference on varlen batches of fresh prompts, continuing chunks
and decode rows."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from kernels.attention import (
    DECODE_MAX_SPLITS,
    PrefillTiles,
    _launch_paged_prefill_attention,
    decode_block_n,
    decode_split_tokens,
    kv_int8_group_size,
    paged_attention_decode,
    paged_attention_decode_ref,
    paged_prefill_attention,
    paged_prefill_attention_ref,
    quantize_kv_int8_ref,
    store_kv,
    store_kv_ref,
)
from kernels.attention import (
    DECODE_NEW_DEFAULTS as NEW_DEFAULTS,
)

# NOTE: interpreter_fixes (conftest.py): two gaps of Triton 3.6's interpreter that the decode kernel meets
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("interpreter_fixes")]


def _slots(tokens: int, num_pages: int, page_size: int, device: str) -> torch.Tensor:
    slot_mapping = torch.randperm(num_pages * page_size, device=device)[:tokens]
    slot_mapping[::3] = -1  # padding tokens are skipped
    return slot_mapping


@pytest.mark.parametrize(("tokens", "kv_heads", "head_dim", "page_size"), [(37, 4, 256, 64), (5, 2, 96, 16)])
def test_store_kv_is_bit_exact(tokens, kv_heads, head_dim, page_size, device):
    num_pages = 6
    key = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    value = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    caches = [
        torch.randn(num_pages, page_size, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
        for _ in "kv"
    ]
    slot_mapping = _slots(tokens, num_pages, page_size, device)
    expected = [c.clone() for c in caches]
    store_kv_ref(key, value, *expected, slot_mapping)
    store_kv(key, value, *caches, slot_mapping)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


@pytest.mark.parametrize(
    ("tokens", "kv_heads", "head_dim", "page_size", "dtype"),
    [
        (37, 4, 256, 64, torch.bfloat16),  # 27B: 4 groups of 64
        (11, 2, 192, 16, torch.float32),  # 3 groups (padded to 4 in the kernel)
        (9, 3, 40, 16, torch.bfloat16),  # under 64: one group of 40
    ],
)
def test_store_kv_int8_is_bit_exact(tokens, kv_heads, head_dim, page_size, dtype, device):
    num_pages, num_scales = 6, head_dim // kv_int8_group_size(head_dim)
    key = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=dtype)
    value = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=dtype) * 30
    key[1, 0, : min(64, head_dim)] = 0  # an all-zero group: scale 0, codes 0
    key[2] *= 1e-6  # scales in fp16's subnormal range (the reference clamps them before dividing)
    ties = (torch.arange(head_dim, device=device) % 64 - 32) + 0.5  # with 127 first in each group: scale
    ties[:: min(64, head_dim)] = 127  # exactly 1, so every other value is a tie (x.5), rounded to even
    value[4, -1] = ties.to(dtype)
    shape = (num_pages, page_size, kv_heads, head_dim)
    caches = [torch.randint(-127, 128, shape, device=device, dtype=torch.int8) for _ in "kv"]
    scales = [torch.rand(*shape[:3], num_scales, device=device).half() for _ in "kv"]
    slot_mapping = _slots(tokens, num_pages, page_size, device)
    expected = [t.clone() for t in (*caches, *scales)]
    store_kv_ref(key, value, *expected[:2], slot_mapping, *expected[2:])
    store_kv(key, value, *caches, slot_mapping, *scales)
    for name, got, want in zip(
        ("key", "value", "key_scale", "value_scale"), (*caches, *scales), expected, strict=True
    ):
        mismatch = (got != want).sum().item()
        assert torch.equal(got, want), f"{name}: {mismatch} of {got.numel()} entries differ"


def _cache_and_table(
    seq_lens: list[int], kv_heads: int, head_dim: int, page_size: int, max_pages: int, device: str,
    dtype: torch.dtype = torch.bfloat16, int8: bool = False,
) -> tuple[torch.Tensor, ...]:  # fmt: skip
    """Random caches (int8: quantised random values, plus their scales), a page table of distinct random
    pages, lens. -> key_cache, value_cache, page_table, seq_lens, key_scale, value_scale (None unless int8)"""
    num_pages = len(seq_lens) * max_pages + 3
    shape = (num_pages, page_size, kv_heads, head_dim)
    key_cache, value_cache = (torch.randn(shape, device=device, dtype=dtype) for _ in "kv")
    key_scale = value_scale = None
    if int8:
        num_scales = head_dim // kv_int8_group_size(head_dim)
        # groups 4x apart in magnitude (keys rising, values falling along head_dim): a scale applied to the
        # wrong group would be off by 4x or more, far outside any tolerance
        ramp = (4.0 ** torch.arange(num_scales, device=device)).repeat_interleave(head_dim // num_scales)
        key_cache, value_cache = (
            key_cache * (2 * ramp / ramp[-1]),
            value_cache * (2 * ramp.flip(0) / ramp[-1]),
        )
        (key_cache, key_scale), (value_cache, value_scale) = (
            quantize_kv_int8_ref(c, num_scales) for c in (key_cache, value_cache)
        )
    page_table = torch.randperm(num_pages, device=device)[: len(seq_lens) * max_pages].view(len(seq_lens), -1)
    lens = torch.tensor(seq_lens, device=device, dtype=torch.int32)
    return key_cache, value_cache, page_table.int(), lens, key_scale, value_scale


# The real geometries with long sequences take minutes under the interpreter: GPU only.
CUDA_ONLY = pytest.mark.skipif(not torch.cuda.is_available(), reason="real-geometry size: GPU only")


@pytest.mark.parametrize(
    ("seq_lens", "q_heads", "kv_heads", "head_dim", "page_size", "max_pages", "max_splits"),
    [
        pytest.param([8192], 24, 4, 256, 64, 130, DECODE_MAX_SPLITS, marks=CUDA_ONLY),  # 27B attention
        pytest.param(
            [1, 700, 4097, 8000, 33, 64, 65, 2500], 24, 4, 256, 64, 126, DECODE_MAX_SPLITS, marks=CUDA_ONLY
        ),
        pytest.param([131072, 5], 16, 2, 256, 64, 2048, DECODE_MAX_SPLITS, marks=CUDA_ONLY),  # 128k, 35B-A3B
        ([1, 300, 2200, 17], 6, 1, 256, 64, 36, DECODE_MAX_SPLITS),  # 2200 keys: 69 one-tile splits
        ([300, 17], 16, 2, 256, 64, 8, 3),  # 35B-A3B ratio, 3 splits at most (of 128 keys)
        ([50, 3, 0], 6, 6, 80, 16, 5, 1),  # MHA, odd head_dim, one split; an empty sequence gets zeros
    ],
)
def test_paged_decode_matches_reference(
    seq_lens, q_heads, kv_heads, head_dim, page_size, max_pages, max_splits, device, assert_close
):
    key_cache, value_cache, page_table, lens, _, _ = _cache_and_table(
        seq_lens, kv_heads, head_dim, page_size, max_pages, device
    )
    query = torch.randn(len(seq_lens), q_heads, head_dim, device=device, dtype=torch.bfloat16)
    scale = head_dim**-0.5
    expected = paged_attention_decode_ref(query, key_cache, value_cache, page_table, lens, scale)
    out = paged_attention_decode(
        query, key_cache, value_cache, page_table, lens, scale, max_splits=max_splits
    )
    # probabilities go through bf16 for the P @ V product (as in FlashAttention): bf16-level agreement
    assert_close("out", out, expected, 1e-2, 2e-2)


@pytest.mark.parametrize(
    ("seq_lens", "q_heads", "kv_heads", "head_dim", "page_size", "max_pages", "max_splits"),
    [
        pytest.param([8192, 1, 3000], 24, 4, 256, 64, 130, DECODE_MAX_SPLITS, marks=CUDA_ONLY),  # 27B
        pytest.param([65536, 700], 16, 2, 256, 64, 1024, DECODE_MAX_SPLITS, marks=CUDA_ONLY),  # 35B-A3B
        ([1, 200, 700, 64], 24, 4, 256, 64, 11, 8),  # 27B geometry; 700 keys: 8 splits of 96
        ([129, 0, 5], 16, 2, 256, 64, 3, DECODE_MAX_SPLITS),  # 35B-A3B ratio; an empty sequence: zeros
        ([77, 1, 16], 4, 2, 40, 16, 5, DECODE_MAX_SPLITS),  # head_dim under 64: one group of 40
        ([90, 33], 6, 3, 192, 16, 6, DECODE_MAX_SPLITS),  # 3 groups, padded to 4 tile-wide
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_paged_decode_int8_matches_reference(
    seq_lens, q_heads, kv_heads, head_dim, page_size, max_pages, max_splits, dtype, device, assert_close
):
    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        seq_lens, kv_heads, head_dim, page_size, max_pages, device, int8=True
    )
    assert key_cache.dtype == torch.int8
    query = torch.randn(len(seq_lens), q_heads, head_dim, device=device, dtype=dtype)
    scale = head_dim**-0.5
    args = (query, key_cache, value_cache, page_table, lens, scale, key_scale, value_scale)
    expected = paged_attention_decode_ref(*args)  # the same int8 cache, dequantised in fp32
    out = paged_attention_decode(*args, max_splits=max_splits)
    # the dequantised K and V and the probabilities each enter the tensor-core dots rounded to the query dtype
    # (the reference stays in fp32): three bf16 roundings, ~1% rms at these lengths, hence twice the bf16 KV
    # test's limit (fp32 queries run TF32 dots on the GPU, and match to ~1e-7 under the interpreter)
    assert_close("out", out, expected, 2e-2, 2e-2)
    assert torch.equal(out[lens == 0], torch.zeros_like(out[lens == 0]))


# The int8 paths and the tuning knobs (bench/kernels/decode_attention.py sweeps them on the GPU): the fp16
# dequantisation (the default for 16-bit queries) and the fp32 one, one-tile splits of 16 or 32 keys, and caps of
# 1..N splits, over lengths on both sides of page edges (page 16: 15, 16, 17, 32, 33), one key, an odd long
# one, GQA groups of 3 and 4 and two scale groups a head.
_KNOB_LENS = [1, 15, 16, 17, 33, 95, 131]


@pytest.mark.parametrize("max_splits", [1, 2, 3, 7, DECODE_MAX_SPLITS])
@pytest.mark.parametrize(("int8_f16", "block_n"), [(True, 16), (True, 32), (False, 16)])
def test_paged_decode_int8_paths_and_knobs_match_reference(
    int8_f16, block_n, max_splits, device, assert_close
):
    q_heads, kv_heads, head_dim, page_size = 6, 2, 128, 16
    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        _KNOB_LENS, kv_heads, head_dim, page_size, 10, device, int8=True
    )
    query = torch.randn(len(_KNOB_LENS), q_heads, head_dim, device=device, dtype=torch.bfloat16)
    args = (query, key_cache, value_cache, page_table, lens, head_dim**-0.5, key_scale, value_scale)
    expected = paged_attention_decode_ref(*args)
    out = paged_attention_decode(*args, max_splits=max_splits, block_n=block_n, int8_f16=int8_f16)
    assert_close("out", out, expected, 2e-2, 2e-2)
    if int8_f16:  # fp16 dots are finer than the bf16 ones of the fp32 path: hold them to a tighter bound
        assert_close("out (fp16 dots)", out, expected, 1e-2, 1e-2)


@pytest.mark.parametrize("max_splits", [1, 4, DECODE_MAX_SPLITS])
def test_paged_decode_bf16_split_caps_match_reference(max_splits, device, assert_close):
    q_heads, kv_heads, head_dim, page_size = 8, 2, 64, 16
    key_cache, value_cache, page_table, lens, _, _ = _cache_and_table(
        _KNOB_LENS, kv_heads, head_dim, page_size, 10, device
    )
    query = torch.randn(len(_KNOB_LENS), q_heads, head_dim, device=device, dtype=torch.bfloat16)
    args = (query, key_cache, value_cache, page_table, lens, head_dim**-0.5)
    out = paged_attention_decode(*args, max_splits=max_splits, block_n=16)
    assert_close("out", out, paged_attention_decode_ref(*args), 1e-2, 2e-2)


def test_int8_f16_clamps_queries_to_the_fp16_range(device, assert_close):
    # a query entry past fp16's range must not become inf in the fp16 dots: it is clamped to +-65504 first,
    # so a softmax dominated by it is still one-hot, as in the reference
    q_heads, kv_heads, head_dim, page_size = 2, 1, 64, 16
    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        [20], kv_heads, head_dim, page_size, 2, device, int8=True
    )
    query = torch.zeros(1, q_heads, head_dim, device=device, dtype=torch.bfloat16)
    query[0, :, 0] = 1e6
    args = (query, key_cache, value_cache, page_table, lens, 1.0, key_scale, value_scale)
    out = paged_attention_decode(*args, int8_f16=True)
    assert torch.isfinite(out.float()).all()
    assert_close("out", out, paged_attention_decode_ref(*args), 1e-2, 2e-2)


# int8_grouped (decode_int8.py: one fp16 dot per 64-value scale group on the raw codes, scales applied to the
# dots' results): 4 groups (27B, batch 1 and several, 64- and 32-key tiles), 3, 2, one group of 64 and one under
# 64 (32 and 40, padded), GQA groups of 1 to 8, partial pages, an empty sequence. fp32 queries keep the output
# unrounded, so the test sees the kernel's own error: held to 1e-3 rms and to at most 1.1x the int8_f16 path's
# on the same batch (measured 1.4e-4..4.0e-4, 0.57x..0.94x; fp16 queries alike); with bf16 queries the output's
# rounding dominates (~4e-3 rms on both paths).
_GROUPED_CASES = [  # (seq_lens, q_heads, kv_heads, head_dim, page_size, max_pages, max_splits, block_n)
    ([1, 200, 700, 64], 24, 4, 256, 64, 11, 8, 64),  # 27B geometry, batch 4; 700 keys: 8 splits of 128
    ([300], 24, 4, 256, 64, 5, 3, 64),  # 27B, batch 1, 3 splits of 128 (the last partial)
    ([129, 0, 5], 16, 2, 256, 64, 3, DECODE_MAX_SPLITS, 32),  # 35B-A3B ratio, 32-key tiles; no keys: zeros
    ([90, 33], 6, 3, 192, 16, 6, DECODE_MAX_SPLITS, 16),  # 3 groups
    ([95, 17, 1], 8, 1, 128, 16, 7, 4, 16),  # 2 groups, GQA 8
    ([77, 1, 16], 4, 2, 64, 16, 5, DECODE_MAX_SPLITS, 16),  # one group of 64
    ([77, 1, 16], 4, 4, 32, 16, 5, DECODE_MAX_SPLITS, 16),  # one group of 32 (MHA)
    ([40, 9], 6, 2, 40, 16, 3, 2, 16),  # one group of 40, padded to 64
]


@pytest.mark.parametrize(
    ("seq_lens", "q_heads", "kv_heads", "head_dim", "page_size", "max_pages", "max_splits", "block_n"),
    _GROUPED_CASES,
    ids=[f"d{c[3]}-g{c[1] // c[2]}-b{len(c[0])}-n{c[7]}" for c in _GROUPED_CASES],
)
@pytest.mark.parametrize(
    "dtype", [torch.float32, torch.bfloat16, torch.float16], ids=["fp32", "bf16", "fp16"]
)
def test_paged_decode_int8_grouped_matches_reference(
    seq_lens: list[int], q_heads: int, kv_heads: int, head_dim: int, page_size: int, max_pages: int,
    max_splits: int, block_n: int, dtype: torch.dtype, device: str, assert_close: Callable[..., None],
) -> None:  # fmt: skip
    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        seq_lens, kv_heads, head_dim, page_size, max_pages, device, int8=True
    )
    query = torch.randn(len(seq_lens), q_heads, head_dim, device=device, dtype=dtype) * 2
    args = (query, key_cache, value_cache, page_table, lens, head_dim**-0.5, key_scale, value_scale)
    expected = paged_attention_decode_ref(*args)
    out = paged_attention_decode(
        *args, max_splits=max_splits, block_n=block_n, int8_grouped=True, int8_keys_major=False
    )
    f16 = paged_attention_decode(*args, max_splits=max_splits, block_n=block_n, int8_f16=True)
    assert torch.equal(out[lens == 0], torch.zeros_like(out[lens == 0]))
    err, err_f16 = (_rel_rms(x, expected) for x in (out, f16))
    if dtype == torch.float32:  # the kernel's own error: the exact K side, fp16 weights (measured 0.6-0.95x)
        assert err <= 1.1 * err_f16 and err <= 1e-3, f"int8_grouped {err:.3e}, int8_f16 {err_f16:.3e}"
    else:  # the output's rounding (bf16: ~4e-3 on both paths here) dominates: the same up to its noise
        assert err <= err_f16 + 1e-3, f"int8_grouped {err:.3e}, int8_f16 {err_f16:.3e}"
    assert_close("out", out, expected, 6e-3, 1e-3)


def _rel_rms(actual: torch.Tensor, expected: torch.Tensor) -> float:
    err = (actual.double() - expected.double()).pow(2).mean().sqrt()
    return (err / expected.double().pow(2).mean().sqrt()).item()


# int8_keys_major (decode_int8.py's keys-major build: keys as the MMAs' rows, query heads as their columns, BLOCK_G
# 8 or 16): the grouped cases, plus GQA 4 over lengths on both sides of a page edge (15, 16, 17 at page 16) and GQA 16
# (BLOCK_G 16). The same arithmetic as int8_grouped in another order: held to the grouped kernel's bounds against
# the reference, and to ~1e-4 of the grouped kernel's own output.
_KEYS_MAJOR_CASES = [
    *_GROUPED_CASES,
    ([15, 16, 17], 8, 2, 128, 16, 3, 2, 16),  # GQA 4, batch 3 across a page edge
    ([33, 5], 16, 1, 64, 16, 3, 2, 16),  # GQA 16
]


@pytest.mark.parametrize(
    ("seq_lens", "q_heads", "kv_heads", "head_dim", "page_size", "max_pages", "max_splits", "block_n"),
    _KEYS_MAJOR_CASES,
    ids=[f"d{c[3]}-g{c[1] // c[2]}-b{len(c[0])}-n{c[7]}" for c in _KEYS_MAJOR_CASES],
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_paged_decode_int8_keys_major_matches_reference_and_grouped(
    seq_lens: list[int], q_heads: int, kv_heads: int, head_dim: int, page_size: int, max_pages: int,
    max_splits: int, block_n: int, dtype: torch.dtype, device: str, assert_close: Callable[..., None],
) -> None:  # fmt: skip
    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        seq_lens, kv_heads, head_dim, page_size, max_pages, device, int8=True
    )
    query = torch.randn(len(seq_lens), q_heads, head_dim, device=device, dtype=dtype) * 2
    args = (query, key_cache, value_cache, page_table, lens, head_dim**-0.5, key_scale, value_scale)
    expected = paged_attention_decode_ref(*args)
    knobs = {"max_splits": max_splits, "block_n": block_n, "int8_grouped": True}
    out = paged_attention_decode(*args, **knobs, int8_keys_major=True)
    grouped = paged_attention_decode(*args, **knobs, int8_keys_major=False)
    assert torch.equal(out[lens == 0], torch.zeros_like(out[lens == 0]))
    live = lens > 0
    err, err_grouped, apart = (
        _rel_rms(out[live], expected[live]), _rel_rms(grouped[live], expected[live]), _rel_rms(out[live], grouped[live])
    )  # fmt: skip
    if dtype == torch.float32:  # the kernel's own error (grouped: measured 1.4e-4..4.0e-4)
        assert err <= 1e-3 and apart <= 1e-4, (
            f"keys_major {err:.3e}, grouped {err_grouped:.3e}, apart {apart:.3e}"
        )
    else:  # the output's bf16 rounding (~4e-3) dominates
        assert err <= err_grouped + 1e-3, f"keys_major {err:.3e}, grouped {err_grouped:.3e}"
    assert_close("out", out, expected, 6e-3, 1e-3)


def test_int8_attention_switch_selects_the_keys_major_build(
    monkeypatch: pytest.MonkeyPatch, device: str, assert_close: Callable[..., None]
) -> None:
    # NINFER_INT8_ATTENTION (kernels._dispatch.INT8_ATTENTION) picks the build when the call does not say; the call's
    # int8_keys_major wins over it
    import kernels._dispatch
    import kernels.attention.decode as decode

    launched: list[str] = []

    class Recorder:
        def __init__(self, name: str, kernel: object) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid: tuple[int, ...]) -> Callable[..., None]:
            launched.append(self.name)
            return self.kernel[grid]  # type: ignore[index]

    for name in ("_paged_attention_decode_int8_kernel", "_paged_attention_decode_int8_km_kernel"):
        monkeypatch.setattr(decode, name, Recorder(name, getattr(decode, name)))
    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        [70, 9], 2, 64, 16, 5, device, int8=True
    )
    query = torch.randn(2, 12, 64, device=device, dtype=torch.bfloat16)
    args = (query, key_cache, value_cache, page_table, lens, 0.125, key_scale, value_scale)
    expected = paged_attention_decode_ref(*args)
    for mode, knob, kernel in [
        ("keys_major", None, "_paged_attention_decode_int8_km_kernel"),
        ("grouped", None, "_paged_attention_decode_int8_kernel"),
        ("grouped", True, "_paged_attention_decode_int8_km_kernel"),
        ("keys_major", False, "_paged_attention_decode_int8_kernel"),
    ]:
        monkeypatch.setattr(kernels._dispatch, "INT8_ATTENTION", mode)
        launched.clear()
        out = paged_attention_decode(*args, block_n=16, int8_keys_major=knob)
        assert launched == [kernel], (mode, knob, launched)
        assert_close(f"out ({mode}, {knob})", out, expected, 6e-3, 1e-3)


@pytest.mark.parametrize("keys_major", [False, True], ids=["grouped", "keys_major"])
@pytest.mark.parametrize("value_magnitude", [1e-4, 1.0, 3e3], ids=["tiny", "unit", "large"])
def test_int8_grouped_weights_keep_their_precision_at_any_value_scale(
    value_magnitude: float, keys_major: bool, device: str
) -> None:
    # p times a value scale straight to fp16 would fall into fp16's subnormals for small values (absmax ~4e-4:
    # scales near 2^-18; without the normalisation this case measured 2.8e-2 rms): the weights are divided by
    # the split's first tile's largest scale, so the error is the same at every magnitude (the reference scales exactly
    # with the values), large values (scales ~100) included.
    q_heads, kv_heads, head_dim, page_size = 6, 2, 128, 16
    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        [95, 40], kv_heads, head_dim, page_size, 7, device
    )
    (key_cache, key_scale), (value_cache, value_scale) = (
        quantize_kv_int8_ref(c.float() * mag, head_dim // 64)
        for c, mag in ((key_cache, 1.0), (value_cache, value_magnitude))
    )
    query = torch.randn(2, q_heads, head_dim, device=device, dtype=torch.float32) * 2
    args = (query, key_cache, value_cache, page_table, lens, head_dim**-0.5, key_scale, value_scale)
    out = paged_attention_decode(
        *args, int8_grouped=True, int8_keys_major=keys_major, max_splits=2, block_n=16
    )
    err = _rel_rms(out, paged_attention_decode_ref(*args))
    assert torch.isfinite(out).all() and err <= 1e-3, (
        f"rel rms {err:.3e} at value magnitude {value_magnitude}"
    )


def test_split_rule_bounds_splits_and_depends_on_length_only():
    for head_dim in (80, 256):
        unit = decode_block_n(head_dim)
        for seq_len in [1, unit, unit + 1, 1000, 2048, 2049, 8192, 131072, 262144 + 7]:
            n = decode_split_tokens(seq_len, unit)
            assert n % unit == 0 and -(-seq_len // n) <= DECODE_MAX_SPLITS, (head_dim, seq_len, n)
            assert n == unit or -(-seq_len // (n - unit)) > DECODE_MAX_SPLITS  # the fewest units that fit
    # enough programs at batch 1 with 4 KV heads (132 SMs), a bounded count at 128k
    assert 4 * -(-1024 // decode_split_tokens(1024, 32)) == 128
    assert 4 * -(-8192 // decode_split_tokens(8192, 32)) == 4 * DECODE_MAX_SPLITS
    for cap in (DECODE_MAX_SPLITS, NEW_DEFAULTS["max_splits"]):
        assert 4 * -(-8192 // decode_split_tokens(8192, 32, cap)) == 4 * cap
        assert -(-131072 // decode_split_tokens(131072, 32, cap)) == cap
    assert -(-100_000 // decode_split_tokens(100_000, 32, 128)) == 125  # 128 splits max: splits of 800 keys


# Batch invariance. The engine pads the way engine/runner/graphs.py says: a captured batch of m rows serves n <= m
# live rows, rows n..m-1 have seq_len 1 and whatever page-table row was left there, and the page table has
# the graph's fixed width (max_pages_per_seq); an eager step's table is as wide as its longest row. On the
# GPU the default split rule runs (5000 keys: 79 splits of 64); the interpreter caps splits at 8 to stay
# small (300 keys at head_dim 256: 5 splits of 64), the same rule with another constant.
BATCH_LENS = {
    DECODE_MAX_SPLITS: [1, 70, 700, 5000, 33],  # one split, a few, many one-tile ones, 64-key ones, a partial
    8: [1, 70, 300, 200, 33],
}


_INVARIANCE_GEOMETRIES = [  # (q_heads, kv_heads, head_dim, page_size, max_splits, real size, id)
    (24, 4, 256, 64, DECODE_MAX_SPLITS, True, "27b"),
    (16, 2, 256, 64, DECODE_MAX_SPLITS, True, "35b-a3b"),
    (4, 2, 80, 16, DECODE_MAX_SPLITS, True, "odd-d80"),
    (6, 1, 256, 64, 8, False, "27b-ratio-kv1-8splits"),
    (4, 2, 64, 16, 8, False, "d64-page16-8splits"),
]


@pytest.mark.parametrize(
    ("q_heads", "kv_heads", "head_dim", "page_size", "max_splits", "kind"),
    [
        pytest.param(*g[:5], kind, marks=[CUDA_ONLY] if g[5] else [], id=f"{kind}-{g[6]}")
        for kind in ("bf16", "fp32", "int8", "int8_grouped", "int8_keys_major")
        for g in _INVARIANCE_GEOMETRIES
        # int8 KV needs head_dim a multiple of 64 (or under it): no int8 case at d80
        if not (kind.startswith("int8") and g[2] % 64 and g[2] > 64)
    ],
)
def test_paged_decode_is_batch_invariant(q_heads, kv_heads, head_dim, page_size, max_splits, kind, device):
    lens = BATCH_LENS[max_splits]
    dtype = torch.float32 if kind == "fp32" else torch.bfloat16
    need = [-(-n // page_size) for n in lens]
    graph_width = max(need) + 5  # the graphs' fixed page-table width
    key_cache, value_cache, _, _, key_scale, value_scale = _cache_and_table(
        [0] * 4, kv_heads, head_dim, page_size, sum(need), device, dtype=dtype, int8=kind.startswith("int8")
    )
    num_pages = key_cache.shape[0]
    pages = torch.randperm(num_pages, device=device)[: sum(need)].int().split(need)
    queries = torch.randn(len(lens), q_heads, head_dim, device=device, dtype=dtype)
    scale = head_dim**-0.5

    def decode(rows: list[int], width: int, padding: int = 0) -> torch.Tensor:
        """Decode ``rows`` (indices into lens) in one batch with a ``width``-page table, then ``padding``
        graph padding rows (seq_len 1, stale page rows) -> the live rows' outputs."""
        n = len(rows) + padding
        table = torch.randint(0, num_pages, (n, width), device=device, dtype=torch.int32)  # stale entries
        seq_lens = torch.ones(n, device=device, dtype=torch.int32)
        query = torch.randn(n, q_heads, head_dim, device=device, dtype=dtype)
        for i, r in enumerate(rows):
            table[i, : need[r]] = pages[r]
            seq_lens[i] = lens[r]
            query[i] = queries[r]
        out = paged_attention_decode(
            query,
            key_cache,
            value_cache,
            table,
            seq_lens,
            scale,
            key_scale,
            value_scale,
            max_splits=max_splits,
            int8_grouped=kind in ("int8_grouped", "int8_keys_major"),
            int8_keys_major=kind == "int8_keys_major",
        )
        return out[: len(rows)]

    everyone = list(range(len(lens)))
    batched = {
        "graph of 8, fixed width": decode(everyone, graph_width, padding=3),
        "eager, width of the longest": decode(everyone, max(need)),
        "reordered, wider": decode(everyone[::-1], graph_width + 40).flip(0),
    }
    for r in everyone:
        alone = {
            "alone, own width": decode([r], need[r])[0],
            "alone, graph of 2": decode([r], graph_width, padding=1)[0],
        }
        reference = alone["alone, own width"]
        for name, out in [*alone.items(), *((k, v[r]) for k, v in batched.items())]:
            diff = (out.float() - reference.float()).abs().max().item()
            assert torch.equal(out, reference), f"seq {r} ({lens[r]} keys), {name}: max diff {diff:.3e}"


# ---------------------------------------------------------------------------------------------------
# Prefill: paged_prefill_attention against paged_attention_ref (its reference) on varlen batches. A plan is
# one (cached tokens, new tokens) pair per sequence: fresh prompts (0 cached), chunks continuing a cached
# prefix on both sides of a page edge (1, 63, 64, 65, 300 cached), decode rows (1 new token) and sequences
# with no new tokens, all in one batch.

PLAN_MIXED = [(0, 130), (1, 5), (63, 64), (64, 1), (65, 130), (300, 5)]
PLAN_OTHER = [(300, 64), (0, 1), (65, 5), (64, 0), (63, 130), (1, 64), (0, 5)]


def _prefill_batch(
    plan: list[tuple[int, int]], q_heads: int, kv_heads: int, head_dim: int, page_size: int, device: str,
    dtype: torch.dtype = torch.bfloat16, int8: bool = False, index_dtype: torch.dtype = torch.int32,
) -> tuple[torch.Tensor | None, ...]:  # fmt: skip
    """(query, key_cache, value_cache, page_table, query_start_loc, seq_lens, key_scale, value_scale) for
    ``plan``; the page table is two pages wider than needed (its stale entries are never read)."""
    seq_lens = [cached + new for cached, new in plan]
    max_pages = max(-(-n // page_size) for n in seq_lens) + 2
    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        seq_lens, kv_heads, head_dim, page_size, max_pages, device, dtype=dtype, int8=int8
    )
    starts = torch.tensor([0] + [new for _, new in plan], device=device).cumsum(0)
    query = torch.randn(int(starts[-1]), q_heads, head_dim, device=device, dtype=dtype)
    return (
        query, key_cache, value_cache, page_table.to(index_dtype), starts.to(index_dtype), lens.to(index_dtype),
        key_scale, value_scale,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("plan", "q_heads", "kv_heads", "head_dim", "page_size"),
    [
        pytest.param(
            [(0, 4096), (8192, 2048), (0, 1), (3000, 7), (100, 700)],
            24,
            4,
            256,
            64,
            marks=CUDA_ONLY,
            id="27b",
        ),
        pytest.param([(20000, 1024), (0, 513), (131, 1)], 16, 2, 256, 64, marks=CUDA_ONLY, id="35b-a3b"),
        pytest.param(PLAN_MIXED, 24, 4, 256, 64, id="27b-ratio"),
        pytest.param(PLAN_OTHER, 16, 2, 128, 64, id="35b-ratio-d128"),
        pytest.param(PLAN_MIXED, 6, 1, 80, 16, id="6to1-d80-page16"),
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_paged_prefill_matches_reference(
    plan, q_heads, kv_heads, head_dim, page_size, dtype, device, assert_close
):
    args = _prefill_batch(plan, q_heads, kv_heads, head_dim, page_size, device, dtype)
    scale = head_dim**-0.5
    expected = paged_prefill_attention_ref(*args[:6], scale)
    out = paged_prefill_attention(*args[:6], scale)
    # bf16: the probabilities enter the P @ V product in bf16 (as in FlashAttention), and the output is rounded
    # to bf16 in both; fp32 queries get exact fp32 dots (no TF32)
    assert_close("out", out, expected, *((1e-2, 2e-2) if dtype == torch.bfloat16 else (1e-4, 1e-5)))


@pytest.mark.parametrize(
    ("plan", "q_heads", "kv_heads", "head_dim", "page_size", "dtype"),
    [
        pytest.param(
            [(0, 2048), (6000, 1000), (1, 1)], 24, 4, 256, 64, torch.bfloat16, marks=CUDA_ONLY, id="27b"
        ),
        pytest.param(PLAN_MIXED, 24, 4, 256, 64, torch.bfloat16, id="27b-ratio"),  # 4 groups of 64
        pytest.param(
            [(300, 5), (0, 64), (65, 1)], 16, 2, 128, 64, torch.float32, id="35b-ratio-d128-fp32"
        ),  # 2 groups
        pytest.param(
            [(65, 64), (0, 5), (300, 1)], 6, 3, 192, 16, torch.bfloat16, id="d192"
        ),  # 3, padded to 4
        pytest.param([(63, 5), (1, 64)], 4, 2, 40, 16, torch.bfloat16, id="d40"),  # under 64: one group
    ],
)
def test_paged_prefill_int8_matches_reference(
    plan, q_heads, kv_heads, head_dim, page_size, dtype, device, assert_close
):
    args = _prefill_batch(plan, q_heads, kv_heads, head_dim, page_size, device, dtype, int8=True)
    assert args[1].dtype == torch.int8
    scale = head_dim**-0.5
    expected = paged_prefill_attention_ref(*args[:6], scale, *args[6:])  # the same codes, dequantised in fp32
    out = paged_prefill_attention(*args[:6], scale, *args[6:])
    # the dequantised K and V enter the dots in the query dtype (bf16: two more roundings than the float-KV test)
    assert_close("out", out, expected, *((2e-2, 2e-2) if dtype == torch.bfloat16 else (1e-4, 1e-5)))


@pytest.mark.parametrize(
    "tiles",
    [
        PrefillTiles(64, 64, 4, 2),
        PrefillTiles(128, 32, 8, 3),
        PrefillTiles(16, 16, 4, 2),
        PrefillTiles(32, 128, 4, 2),  # key tiles of two pages (page size 64)
    ],
    ids=str,
)
def test_paged_prefill_tiles_agree(tiles, device, assert_close):
    """Other tile shapes (as the H200 sweep in bench/kernels/hot_path.py tries; the default one runs in the
    tests above) compute the same attention: the tile starts, the diagonal split and the page lookup (one
    page a key tile, or a tile over two pages) do not depend on the tile's size."""
    args = _prefill_batch(PLAN_MIXED, 6, 1, 64, 64, device, index_dtype=torch.int64)  # (and int64 indices)
    expected = paged_prefill_attention_ref(*args[:6], 0.125)
    out = _launch_paged_prefill_attention(*args[:6], 0.125, *args[6:], tiles=tiles)
    assert_close("out", out, expected, 1e-2, 2e-2)
