"""Paged KV store (bit-exact) and split-K paged decode attention vs their references."""

from __future__ import annotations

import pytest
import torch

from kernels.attention import paged_attention_decode, paged_attention_decode_ref, store_kv, store_kv_ref

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize(("tokens", "kv_heads", "head_dim", "page_size"), [(37, 4, 256, 64), (5, 2, 96, 16)])
def test_store_kv_is_bit_exact(tokens, kv_heads, head_dim, page_size, device):
    num_pages = 6
    key = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    value = torch.randn(tokens, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    caches = [
        torch.randn(num_pages, page_size, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
        for _ in "kv"
    ]
    slot_mapping = torch.randperm(num_pages * page_size, device=device)[:tokens]
    slot_mapping[::3] = -1  # padding tokens are skipped
    expected = [c.clone() for c in caches]
    store_kv_ref(key, value, *expected, slot_mapping)
    store_kv(key, value, *caches, slot_mapping)
    assert torch.equal(caches[0], expected[0]) and torch.equal(caches[1], expected[1])


def _cache_and_table(
    seq_lens: list[int], kv_heads: int, head_dim: int, page_size: int, max_pages: int, device: str
) -> tuple[torch.Tensor, ...]:
    num_pages = len(seq_lens) * max_pages + 3
    key_cache = torch.randn(num_pages, page_size, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    value_cache = torch.randn(num_pages, page_size, kv_heads, head_dim, device=device, dtype=torch.bfloat16)
    page_table = torch.randperm(num_pages, device=device)[: len(seq_lens) * max_pages].view(len(seq_lens), -1)
    return key_cache, value_cache, page_table.int(), torch.tensor(seq_lens, device=device, dtype=torch.int32)


@pytest.mark.parametrize(
    ("seq_lens", "q_heads", "kv_heads", "head_dim", "page_size", "max_pages", "num_splits"),
    [
        ([8192], 24, 4, 256, 64, 130, None),  # 27B attention geometry
        ([1, 700, 4097, 8000, 33, 64, 65, 2500], 24, 4, 256, 64, 126, None),
        ([300, 17], 16, 2, 256, 64, 8, 3),  # 35B-A3B ratio, forced splits
        ([50, 3], 6, 6, 80, 16, 5, 1),  # MHA, odd head_dim, one split
    ],
)
def test_paged_decode_matches_reference(
    seq_lens, q_heads, kv_heads, head_dim, page_size, max_pages, num_splits, device, assert_close
):
    key_cache, value_cache, page_table, lens = _cache_and_table(
        seq_lens, kv_heads, head_dim, page_size, max_pages, device
    )
    query = torch.randn(len(seq_lens), q_heads, head_dim, device=device, dtype=torch.bfloat16)
    scale = head_dim**-0.5
    expected = paged_attention_decode_ref(query, key_cache, value_cache, page_table, lens, scale)
    out = paged_attention_decode(query, key_cache, value_cache, page_table, lens, scale, num_splits)
    # probabilities go through bf16 for the P @ V product (as in FlashAttention): bf16-level agreement
    assert_close("out", out, expected, 1e-2, 2e-2)
