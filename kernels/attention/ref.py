"""The attention contract every kernel here implements, in plain torch: ``gather_kv_ref`` reads a sequence's
cached rows out of its pages (dequantising int8 there), ``paged_attention_ref`` is causal varlen GQA
attention over them. decode.py and prefill.py name their references after their launchers and call this."""

from __future__ import annotations

import torch

from kernels.attention.int8 import dequantize_kv_int8_ref


def gather_kv_ref(
    cache: torch.Tensor, pages: torch.Tensor, num_tokens: int, scale: torch.Tensor | None = None
) -> torch.Tensor:
    """The first ``num_tokens`` cached rows of one sequence, in order.

    cache: [num_pages, page_size, Hkv, D]; pages: [max_pages] page ids -> [num_tokens, Hkv, D] fp32.
    scale: the int8 cache's [num_pages, page_size, Hkv, G] fp16 scales (dequantise here), or None.
    """
    page_size = cache.shape[1]
    num_pages = -(-num_tokens // page_size)
    index = pages[:num_pages].long()
    rows = cache[index].reshape(-1, *cache.shape[2:])[:num_tokens]
    if scale is None:
        return rows.float()
    return dequantize_kv_int8_ref(rows, scale[index].reshape(-1, *scale.shape[2:])[:num_tokens])


def paged_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    cu_seqlens_q: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Causal varlen attention over paged K/V with grouped-query heads.

    query: [T, Hq, D]; caches: [num_pages, page_size, Hkv, D] (Hq a multiple of Hkv; query head h
    reads KV head h // (Hq / Hkv)); page_table: [B, max_pages]; cu_seqlens_q: [B + 1]; seq_lens: [B]
    -> out [T, Hq, D] in query.dtype. key_scale/value_scale: the int8 cache's scales (see
    ``store_kv_ref``), or None for a cache in a float dtype.
    """
    bounds, lens = cu_seqlens_q.tolist(), seq_lens.tolist()
    group = query.shape[1] // key_cache.shape[2]
    out = torch.zeros_like(query)
    for b, total in enumerate(lens):
        start, end = bounds[b], bounds[b + 1]
        if end == start:
            continue
        keys = gather_kv_ref(key_cache, page_table[b], total, key_scale).repeat_interleave(group, dim=1)
        values = gather_kv_ref(value_cache, page_table[b], total, value_scale).repeat_interleave(group, dim=1)
        q = query[start:end].float()
        scores = torch.einsum("qhd,khd->hqk", q, keys) * scale  # [Hq, q_len, total]
        q_pos = torch.arange(total - (end - start), total, device=query.device)
        k_pos = torch.arange(total, device=query.device)
        scores = scores.masked_fill(k_pos[None, None, :] > q_pos[None, :, None], float("-inf"))
        probs = scores.softmax(dim=-1)
        out[start:end] = torch.einsum("hqk,khd->qhd", probs, values).to(query.dtype)
    return out
