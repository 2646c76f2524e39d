"""Paged attention references: bit-exact stores, paged causal varlen GQA == dense SDPA."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.attention import gather_kv_ref, paged_attention_ref, store_kv_ref


def test_store_kv_writes_exact_slots_and_skips_padding():
    k_cache, v_cache = torch.zeros(4, 5, 2, 3), torch.zeros(4, 5, 2, 3)
    key, value = torch.randn(4, 2, 3), torch.randn(4, 2, 3)
    slots = torch.tensor([7, 19, -1, 0])
    store_kv_ref(key, value, k_cache, v_cache, slots)
    flat_k, flat_v = k_cache.view(20, 2, 3), v_cache.view(20, 2, 3)
    for t, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.all(flat_k[slot] == key[t]) and torch.all(flat_v[slot] == value[t])
    assert int((flat_k != 0).any(dim=(1, 2)).sum()) == 3


def test_gather_reads_pages_in_table_order():
    cache = torch.arange(4 * 3 * 1 * 1, dtype=torch.float32).view(4, 3, 1, 1)
    rows = gather_kv_ref(cache, torch.tensor([2, 0, 3]), 7)
    assert rows.flatten().tolist() == [6, 7, 8, 0, 1, 2, 9]


@pytest.mark.parametrize(("hq", "hkv", "page_size"), [(6, 2, 16), (3, 3, 5), (4, 1, 64)])
def test_paged_causal_attention_equals_dense_sdpa(hq, hkv, page_size, assert_close):
    head_dim = 20
    # (cached tokens, new tokens) per sequence: a fresh prefill, a decode step, a later chunk.
    plan = [(0, 63), (40, 1), (17, 30)]
    num_pages = 40
    free = torch.randperm(num_pages).tolist()
    k_cache, v_cache = (
        torch.zeros(num_pages, page_size, hkv, head_dim),
        torch.zeros(num_pages, page_size, hkv, head_dim),
    )
    tables, dense_k, dense_v, queries, slots = [], [], [], [], []
    for cached, new in plan:
        total = cached + new
        pages = [free.pop() for _ in range(-(-total // page_size))]
        tables.append(pages + [0] * (13 - len(pages)))
        k, v = torch.randn(total, hkv, head_dim), torch.randn(total, hkv, head_dim)
        dense_k.append(k)
        dense_v.append(v)
        pos_slots = torch.tensor([pages[p // page_size] * page_size + p % page_size for p in range(total)])
        store_kv_ref(k[:cached], v[:cached], k_cache, v_cache, pos_slots[:cached])  # earlier steps
        slots.append(pos_slots[cached:])
        queries.append(torch.randn(new, hq, head_dim))
    store_kv_ref(torch.cat([k[c:] for k, (c, _) in zip(dense_k, plan, strict=True)]),
                 torch.cat([v[c:] for v, (c, _) in zip(dense_v, plan, strict=True)]),
                 k_cache, v_cache, torch.cat(slots))  # fmt: skip
    cu = torch.tensor([0, 63, 64, 94])
    out = paged_attention_ref(torch.cat(queries), k_cache, v_cache, torch.tensor(tables), cu,
                              torch.tensor([c + n for c, n in plan]), head_dim**-0.5)  # fmt: skip
    for b, (cached, new) in enumerate(plan):
        total = cached + new
        mask = torch.arange(total)[None, :] <= torch.arange(cached, total)[:, None]
        expected = F.scaled_dot_product_attention(
            queries[b].transpose(0, 1), dense_k[b].transpose(0, 1).repeat_interleave(hq // hkv, 0),
            dense_v[b].transpose(0, 1).repeat_interleave(hq // hkv, 0), attn_mask=mask,
        ).transpose(0, 1)  # fmt: skip
        assert_close(f"seq{b}", out[cu[b] : cu[b + 1]], expected)
