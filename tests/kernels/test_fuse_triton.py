"""NINFER_ATTN_FUSE=on's launches against the unfused ones they replace: ``qk_norm_rope_store`` (q/k norms, partial
RoPE and the float K/V store in one launch) bitwise the four unfused launches (``rms_norm`` twice, ``apply_rope_qk``,
``store_kv``) and close to the references; decode's output gate in the split-K reduce bitwise the reduce followed by
``sigmoid_gate_mul``. Inputs are strided views of one fused projection row, as the model hands them over."""

from __future__ import annotations

import pytest
import torch

from kernels.attention import (
    paged_attention_decode,
    paged_attention_decode_ref,
    qk_norm_rope_store,
    qk_norm_rope_store_ref,
    quantize_kv_int8_ref,
)
from kernels.rope import rope_cos_sin_ref

# NOTE: interpreter_fixes (conftest.py): the decode kernel's run-time loop bounds and bf16 dots under the interpreter
pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("interpreter_fixes")]

# Qwen3.5's mrope_section (of rotary_dim / 2 = 32 slots at the 27B's 64 rotary channels)
_MROPE = (11, 11, 10)


def _inputs(
    tokens: int, q_heads: int, kv_heads: int, head_dim: int, rotary_dim: int, page_size: int, dtype: torch.dtype,
    device: str, mrope: bool = False,
) -> tuple[tuple[torch.Tensor, ...], torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:  # fmt: skip
    """(query, gate, key, value views of one fused [T, 2 H D + 2 Hkv D] projection output, q_weight, k_weight,
    cos, sin), slot_mapping (every third token -1), and a float cache pair [pages, page_size, Hkv, D]."""
    fused = torch.randn(tokens, 2 * q_heads * head_dim + 2 * kv_heads * head_dim, device=device).to(dtype)
    fused[:, : 2 * q_heads * head_dim] *= 3.0  # queries of another scale than keys: the norms see it
    query_gate = fused[:, : 2 * q_heads * head_dim].view(tokens, q_heads, 2 * head_dim)
    query, gate = query_gate[..., :head_dim], query_gate[..., head_dim:]
    kv = fused[:, 2 * q_heads * head_dim :]
    key = kv[:, : kv_heads * head_dim].view(tokens, kv_heads, head_dim)
    value = kv[:, kv_heads * head_dim :].view(tokens, kv_heads, head_dim)
    q_weight, k_weight = (0.3 * torch.randn(head_dim, device=device) for _ in "qk")
    if mrope:  # vision positions: three different rows
        positions = torch.randint(0, 4000, (3, tokens), device=device)
    else:
        positions = torch.randint(0, 100_000, (tokens,), device=device)
    cos, sin = rope_cos_sin_ref(positions, rotary_dim, 1e7, _MROPE if mrope else None)
    num_pages = tokens // page_size + 3
    slot_mapping = torch.randperm(num_pages * page_size, device=device)[:tokens]
    slot_mapping[::3] = -1  # CUDA-graph padding rows: nothing stored
    caches = tuple(
        torch.randn(num_pages, page_size, kv_heads, head_dim, device=device).to(dtype) for _ in "kv"
    )
    return (query, gate, key, value, q_weight, k_weight, cos, sin), slot_mapping, caches  # type: ignore[return-value]


_SHAPES = [
    # tokens, q heads, kv heads, head_dim, rotary_dim, page size
    (1, 24, 4, 256, 64, 64),  # 27B decode at C=1
    (3, 24, 4, 256, 64, 64),
    (8, 16, 2, 256, 64, 16),  # 35B-A3B decode at C=8
    (3, 5, 1, 96, 32, 16),  # odd q heads, GQA 5:1, head_dim not a power of two
    (8, 3, 3, 40, 20, 16),  # MHA, odd heads, rotary half 10 (padded to 16 in the tile)
    (37, 7, 7, 128, 128, 16),  # prefill-sized, full rotary (no pass-through channels)
]


@pytest.mark.parametrize(("tokens", "q_heads", "kv_heads", "head_dim", "rotary_dim", "page_size"), _SHAPES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_fused_prologue_is_bitwise_the_unfused_launches(
    tokens, q_heads, kv_heads, head_dim, rotary_dim, page_size, dtype, device, assert_close
):
    (query, _, key, value, q_weight, k_weight, cos, sin), slots, caches = _inputs(
        tokens, q_heads, kv_heads, head_dim, rotary_dim, page_size, dtype, device
    )
    untouched = [c.clone() for c in caches]
    results = {}
    for fused in (False, True):
        kc, vc = (c.clone() for c in caches)
        q = qk_norm_rope_store(
            query, key, value, q_weight, k_weight, 1e-6, cos, sin, kc, vc, slots, fused=fused
        )
        results[fused] = (q, kc, vc)
    for name, got, want in zip(
        ("query", "key_cache", "value_cache"), results[True], results[False], strict=True
    ):
        assert got.dtype == want.dtype and torch.equal(got, want), (
            f"{name}: {(got != want).sum().item()} of {got.numel()} entries differ"
        )
    kc, vc = (c.clone() for c in caches)
    expected = qk_norm_rope_store_ref(query, key, value, q_weight, k_weight, 1e-6, cos, sin, kc, vc, slots)
    assert_close("query vs ref", results[True][0], expected, 1e-2 if dtype == torch.bfloat16 else 1e-5, 1e-5)
    assert_close("keys vs ref", results[True][1], kc, 1e-2 if dtype == torch.bfloat16 else 1e-5, 1e-5)
    assert torch.equal(results[True][2], vc), "the value store is a copy"
    # slot -1 rows wrote nothing: every slot outside the valid ones is as it was
    written = torch.zeros(caches[0].shape[0] * page_size, dtype=torch.bool, device=device)
    written[slots[slots >= 0]] = True
    for got, before in zip(results[True][1:], untouched, strict=True):
        flat_got, flat_before = got.view(-1, kv_heads, head_dim), before.view(-1, kv_heads, head_dim)
        assert torch.equal(flat_got[~written], flat_before[~written])


def test_fused_prologue_takes_mrope_tables(device):
    """Vision positions: the mrope sections live in the cos/sin tables, which the fused kernel reads as they are."""
    (query, _, key, value, q_weight, k_weight, cos, sin), slots, caches = _inputs(
        5, 24, 4, 256, 64, 64, torch.bfloat16, device, mrope=True
    )
    results = []
    for fused in (False, True):
        kc, vc = (c.clone() for c in caches)
        q = qk_norm_rope_store(
            query, key, value, q_weight, k_weight, 1e-6, cos, sin, kc, vc, slots, fused=fused
        )
        results.append((q, kc, vc))
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_int8_cache_keeps_the_unfused_store(device):
    """An int8 cache: the fused switch runs the unfused launches (the quantising store reads the key from memory)."""
    (query, _, key, value, q_weight, k_weight, cos, sin), slots, caches = _inputs(
        3, 6, 2, 128, 64, 16, torch.bfloat16, device
    )
    quantized = [quantize_kv_int8_ref(c, 2) for c in caches]
    results = []
    for fused in (False, True):
        codes = [q[0].clone() for q in quantized]
        scales = [q[1].clone() for q in quantized]
        out = qk_norm_rope_store(
            query, key, value, q_weight, k_weight, 1e-6, cos, sin, *codes, slots, *scales, fused=fused
        )
        results.append((out, *codes, *scales))
    assert all(torch.equal(a, b) for a, b in zip(*results, strict=True))


def test_fused_prologue_with_no_tokens(device):
    (query, _, key, value, q_weight, k_weight, cos, sin), slots, caches = _inputs(
        0, 4, 2, 64, 32, 16, torch.bfloat16, device
    )
    before = [c.clone() for c in caches]
    out = qk_norm_rope_store(
        query, key, value, q_weight, k_weight, 1e-6, cos, sin, *caches, slots, fused=True
    )
    assert out.shape == (0, 4, 64) and all(torch.equal(a, b) for a, b in zip(caches, before, strict=True))


@pytest.mark.parametrize(
    ("seq_lens", "q_heads", "kv_heads", "head_dim", "int8"),
    [
        ([700], 24, 4, 256, False),  # 27B at C=1
        ([1, 130, 0, 64, 33, 9, 300, 2], 24, 4, 256, False),  # C=8, an empty sequence: gated zeros
        ([50, 3], 5, 1, 80, False),  # odd heads, head_dim over one reduce tile (64) and not a multiple of it
        ([90, 17, 1], 6, 2, 128, True),  # int8 KV: the grouped decode kernel, the same reduce
    ],
)
def test_gate_in_the_reduce_is_bitwise_the_separate_launch(
    seq_lens, q_heads, kv_heads, head_dim, int8, device, assert_close
):
    page_size, batch = 16, len(seq_lens)
    max_pages = max(seq_lens) // page_size + 1
    num_pages = batch * max_pages + 2
    shape = (num_pages, page_size, kv_heads, head_dim)
    key_cache, value_cache = (torch.randn(shape, device=device).bfloat16() for _ in "kv")
    scales: tuple[torch.Tensor | None, ...] = (None, None)
    if int8:
        (key_cache, key_scale), (value_cache, value_scale) = (
            quantize_kv_int8_ref(c, head_dim // 64) for c in (key_cache, value_cache)
        )
        scales = (key_scale, value_scale)
    page_table = torch.randperm(num_pages, device=device)[: batch * max_pages].view(batch, -1).int()
    lens = torch.tensor(seq_lens, device=device, dtype=torch.int32)
    query_gate = torch.randn(batch, q_heads, 2 * head_dim, device=device).bfloat16()
    query, gate = query_gate[..., :head_dim].contiguous(), query_gate[..., head_dim:]  # gate: a strided view
    args = (query, key_cache, value_cache, page_table, lens, head_dim**-0.5, *scales, gate)
    unfused = paged_attention_decode(*args, fused=False)
    fused = paged_attention_decode(*args, fused=True)
    assert torch.equal(fused, unfused), f"{(fused != unfused).sum().item()} of {fused.numel()} entries differ"
    assert_close("gated out vs ref", fused, paged_attention_decode_ref(*args), 2e-2, 2e-2)
    assert torch.equal(fused[lens == 0], torch.zeros_like(fused[lens == 0]))
