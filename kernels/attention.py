"""Paged attention references: store K/V into pages, causal varlen GQA attention reading pages.

KV cache layout (one attention layer): ``key_cache`` and ``value_cache`` are
``[num_pages, page_size, num_kv_heads, head_dim]``. Token ``i`` of sequence ``b`` (its absolute
position, counting cached tokens) lives in page ``page_table[b, i // page_size]`` at row
``i % page_size``; ``slot_mapping[t] = page * page_size + row`` is where new token ``t`` is written
(``-1`` = padding, skipped).

A batch is flat (varlen): sequence ``b`` owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``
and has ``seq_lens[b]`` tokens in total (cached + new), so its new tokens sit at absolute positions
``seq_lens[b] - q_len .. seq_lens[b] - 1`` and each attends to every key at or before its own position.

INT8 KV hook: every page read goes through ``gather_kv_ref``; a quantised cache adds its scales
there (dequantise on gather) without touching the attention math.
"""

from __future__ import annotations

import torch


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
) -> None:
    """Write new tokens' K/V into their slots, in place.

    key, value: [T, Hkv, D]; key_cache, value_cache: [num_pages, page_size, Hkv, D]; slot_mapping: [T]
    (flat slot index, -1 = skip).
    """
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    key_cache.view(-1, *key_cache.shape[2:])[slots] = key[valid].to(key_cache.dtype)
    value_cache.view(-1, *value_cache.shape[2:])[slots] = value[valid].to(value_cache.dtype)


def gather_kv_ref(cache: torch.Tensor, pages: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """The first ``num_tokens`` cached rows of one sequence, in order.

    cache: [num_pages, page_size, Hkv, D]; pages: [max_pages] page ids -> [num_tokens, Hkv, D] fp32.
    """
    page_size = cache.shape[1]
    num_pages = -(-num_tokens // page_size)
    rows = cache[pages[:num_pages].long()].reshape(-1, *cache.shape[2:])
    return rows[:num_tokens].float()


def paged_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Causal varlen attention over paged K/V with grouped-query heads.

    query: [T, Hq, D]; caches: [num_pages, page_size, Hkv, D] (Hq a multiple of Hkv; query head h
    reads KV head h // (Hq / Hkv)); page_table: [B, max_pages]; cu_seqlens_q: [B + 1]; seq_lens: [B]
    -> out [T, Hq, D] in query.dtype.
    """
    bounds, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    group = query.shape[1] // key_cache.shape[2]
    out = torch.zeros_like(query)
    for b, total in enumerate(lens):
        start, end = bounds[b], bounds[b + 1]
        if end == start:
            continue
        keys = gather_kv_ref(key_cache, page_table[b], total).repeat_interleave(group, dim=1)
        values = gather_kv_ref(value_cache, page_table[b], total).repeat_interleave(group, dim=1)
        q = query[start:end].float()
        scores = torch.einsum("qhd,khd->hqk", q, keys) * scale  # [Hq, q_len, total]
        q_pos = torch.arange(total - (end - start), total, device=query.device)
        k_pos = torch.arange(total, device=query.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = scores.softmax(dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)
    return out
