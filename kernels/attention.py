"""Paged attention references: store K/V into pages, causal varlen GQA attention reading pages.

KV cache layout (one attention layer): ``key_cache`` and ``value_cache`` are
``[num_pages, page_size, num_kv_heads, head_dim]``. Token ``i`` of sequence ``b`` (its absolute
position, counting cached tokens) lives in page ``page_table[b, i // page_size]`` at row
``i % page_size``; ``slot_mapping[t] = page * page_size + row`` is where new token ``t`` is written
(``-1`` = padding, skipped).

A batch is flat (varlen): sequence ``b`` owns query rows ``cu_seqlens_q[b]:cu_seqlens_q[b + 1]``
and has ``seq_lens[b]`` tokens in total (cached + new), so its new tokens sit at absolute positions
``seq_lens[b] - q_len .. seq_lens[b] - 1`` and each attends to every key at or before its own position.

INT8 KV: a quantised cache stores int8 codes in the same layout plus one fp16 scale per group of
``KV_INT8_GROUP`` (64) values along ``head_dim`` (``[num_pages, page_size, Hkv, head_dim // group]``;
a head_dim under 64 is one group). ``scale = absmax / 127`` per group, ``code = round(x / scale)``.
``store_kv_ref`` quantises when it is given the scale tensors, and every page read goes through
``gather_kv_ref``, which dequantises there: the attention math never sees codes.
"""

from __future__ import annotations

import torch

from kernels._dispatch import HAS_TRITON, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

KV_INT8_GROUP = 64


def kv_int8_group_size(head_dim: int) -> int:
    """Values per fp16 scale along head_dim: 64, or the whole head when it is narrower."""
    group = min(KV_INT8_GROUP, head_dim)
    if head_dim % group:
        raise ValueError(
            f"head_dim={head_dim}: int8 KV needs a multiple of {KV_INT8_GROUP} (or less than it)"
        )
    return group


def quantize_kv_int8_ref(x: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-group int8: x [..., D] -> (codes int8 [..., D], scales fp16 [..., num_groups]).

    ``scale = absmax / 127`` (rounded to fp16 first, so codes match the stored scale); all-zero
    groups get scale 0 and codes 0.
    """
    groups = x.float().unflatten(-1, (num_groups, -1))  # [..., G, D / G]
    scales = (groups.abs().amax(dim=-1) / 127.0).to(torch.float16)
    safe = scales.float().clamp_min(torch.finfo(torch.float16).tiny).unsqueeze(-1)
    codes = (groups / safe).round().clamp(-127, 127).to(torch.int8)
    return codes.flatten(-2), scales


def dequantize_kv_int8_ref(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """codes int8 [..., D], scales fp16 [..., G] -> fp32 [..., D]."""
    groups = codes.float().unflatten(-1, (scales.shape[-1], -1))
    return (groups * scales.float().unsqueeze(-1)).flatten(-2)


def store_kv_ref(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
) -> None:
    """Write new tokens' K/V into their slots, in place.

    key, value: [T, Hkv, D]; key_cache, value_cache: [num_pages, page_size, Hkv, D]; slot_mapping: [T]
    (flat slot index, -1 = skip). With key_scale/value_scale ([num_pages, page_size, Hkv, G] fp16) the
    caches are int8 and the tokens are quantised per group (``quantize_kv_int8_ref``).
    """
    valid = slot_mapping >= 0
    slots = slot_mapping[valid].long()
    for new, cache, scale in ((key, key_cache, key_scale), (value, value_cache, value_scale)):
        flat = cache.view(-1, *cache.shape[2:])
        if scale is None:
            flat[slots] = new[valid].to(cache.dtype)
        else:
            codes, scales = quantize_kv_int8_ref(new[valid], scale.shape[-1])
            flat[slots] = codes
            scale.view(-1, *scale.shape[2:])[slots] = scales


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


def paged_attention_decode_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
) -> torch.Tensor:
    """Decode attention: ``paged_attention_ref`` with exactly one new token per sequence.

    query: [B, Hq, D] (sequence b's token is at position seq_lens[b] - 1); caches: [num_pages,
    page_size, Hkv, D] in a float dtype; page_table: [B, max_pages]; seq_lens: [B] (>= 1)
    -> out [B, Hq, D] in query.dtype.
    """
    cu_seqlens_q = torch.arange(query.shape[0] + 1, device=query.device)
    return paged_attention_ref(query, key_cache, value_cache, page_table, cu_seqlens_q, seq_lens, scale)


# ---------------------------------------------------------------------------------------------------
# Triton

if HAS_TRITON:

    @triton.jit
    def _store_kv_kernel(
        key_ptr,
        value_ptr,
        key_cache_ptr,
        value_cache_ptr,
        slot_mapping_ptr,
        key_stride_t,
        key_stride_h,
        value_stride_t,
        value_stride_h,
        cache_stride_slot,
        cache_stride_head,
        HEAD_DIM: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # grid (T, Hkv): one program copies one token's key and value row for one KV head into its slot.
        token = tl.program_id(0)
        head = tl.program_id(1)
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
        if slot < 0:
            return
        offs = tl.arange(0, BLOCK_D)
        mask = offs < HEAD_DIM
        dst = slot * cache_stride_slot + head * cache_stride_head + offs
        key = tl.load(key_ptr + token * key_stride_t + head * key_stride_h + offs, mask=mask)
        tl.store(key_cache_ptr + dst, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
        value = tl.load(value_ptr + token * value_stride_t + head * value_stride_h + offs, mask=mask)
        tl.store(value_cache_ptr + dst, value.to(value_cache_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _paged_attention_decode_kernel(
        q_ptr,
        key_cache_ptr,
        value_cache_ptr,
        page_table_ptr,
        seq_lens_ptr,
        part_out_ptr,
        part_lse_ptr,
        q_stride_b,
        q_stride_h,
        cache_stride_page,
        cache_stride_row,
        cache_stride_head,
        page_table_stride,
        split_tokens,
        num_splits,
        scale_log2,
        NUM_Q_HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE_SIZE: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # grid (B, Hkv, num_splits): one program runs online softmax for the GROUP query heads that share
        # one KV head, over one split of the sequence's keys (each K/V row read once, for all heads), and
        # writes the split's normalised output and log2-sum-exp for _paged_attention_reduce_kernel.
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + row)
        start = split * split_tokens
        end = tl.minimum(start + split_tokens, seq_len)
        offs_g = tl.arange(0, BLOCK_G)
        offs_d = tl.arange(0, BLOCK_D)
        g_mask = offs_g < GROUP
        d_mask = offs_d < HEAD_DIM
        heads = kv_head * GROUP + offs_g
        q = tl.load(
            q_ptr + row * q_stride_b + heads[:, None] * q_stride_h + offs_d[None, :],
            mask=g_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        for tok0 in range(start, end, BLOCK_N):
            toks = tok0 + tl.arange(0, BLOCK_N)
            t_mask = toks < end
            pages = tl.load(
                page_table_ptr + row * page_table_stride + toks // PAGE_SIZE, mask=t_mask, other=0
            )
            rows = pages.to(tl.int64) * cache_stride_page + (toks % PAGE_SIZE) * cache_stride_row
            kv_offs = (rows + kv_head * cache_stride_head)[:, None] + offs_d[None, :]
            kv_mask = t_mask[:, None] & d_mask[None, :]
            keys = tl.load(key_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
            scores = tl.dot(q, tl.trans(keys)) * scale_log2  # [BLOCK_G, BLOCK_N], log2 domain
            scores = tl.where(t_mask[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            values = tl.load(value_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
            acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values)
            m = m_new
        part = (row * NUM_Q_HEADS + heads) * num_splits + split  # [BLOCK_G]
        out = acc / tl.maximum(l_sum, 1e-30)[:, None]
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
            out,
            mask=g_mask[:, None] & d_mask[None, :],
        )
        tl.store(part_lse_ptr + part, m + tl.log2(l_sum), mask=g_mask)  # -inf for an empty split

    @triton.jit
    def _paged_attention_reduce_kernel(
        part_out_ptr,
        part_lse_ptr,
        out_ptr,
        out_stride_b,
        out_stride_h,
        num_splits,
        NUM_Q_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # grid (B, Hq): one program merges the splits of one query head (weights 2^(lse - max lse)).
        row = tl.program_id(0)
        head = tl.program_id(1)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = tl.arange(0, BLOCK_D)
        s_mask = offs_s < num_splits
        d_mask = offs_d < HEAD_DIM
        base = (row * NUM_Q_HEADS + head) * num_splits
        lse = tl.load(part_lse_ptr + base + offs_s, mask=s_mask, other=float("-inf"))
        weight = tl.exp2(lse - tl.maximum(tl.max(lse, axis=0), -1e30))
        parts = tl.load(
            part_out_ptr + (base + offs_s)[:, None] * HEAD_DIM + offs_d[None, :],
            mask=s_mask[:, None] & d_mask[None, :],
            other=0.0,
        )
        out = tl.sum(parts * weight[:, None], axis=0) / tl.maximum(tl.sum(weight, axis=0), 1e-30)
        tl.store(
            out_ptr + row * out_stride_b + head * out_stride_h + offs_d,
            out.to(out_ptr.dtype.element_ty),
            mask=d_mask,
        )


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
) -> None:
    """Launcher for ``store_kv_ref`` (same contract, bit-exact). The int8 cache still takes the reference."""
    quantised = key_scale is not None or value_scale is not None
    if quantised or not use_triton(key, value, key_cache, value_cache, slot_mapping):
        store_kv_ref(key, value, key_cache, value_cache, slot_mapping, key_scale, value_scale)
        return
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape, f"value {tuple(value.shape)} != key {tuple(key.shape)}"
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.shape[2:] == (num_kv_heads, head_dim), f"cache {tuple(key_cache.shape)}"
    assert key_cache.stride(0) == key_cache.shape[1] * key_cache.stride(1), "pages must tile the slot axis"
    assert key_cache.stride(3) == 1 and key.stride(2) == 1 and value.stride(2) == 1
    assert slot_mapping.shape == (num_tokens,)
    if num_tokens:
        _store_kv_kernel[(num_tokens, num_kv_heads)](
            key, value, key_cache, value_cache, slot_mapping,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1), key_cache.stride(1), key_cache.stride(2),
            HEAD_DIM=head_dim, BLOCK_D=triton.next_power_of_2(head_dim),
        )  # fmt: skip


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    num_splits: int | None = None,
) -> torch.Tensor:
    """Launcher for ``paged_attention_decode_ref`` (same contract; split-K "flash decoding").

    The split count depends only on shapes (the page table's capacity), never on seq_lens' values, so
    the launch needs no host sync and can be captured in a CUDA graph; splits past a sequence's end
    exit at once. num_splits overrides the choice (tests use it to cover the merge).
    """
    if not use_triton(query, key_cache, value_cache, page_table, seq_lens):
        return paged_attention_decode_ref(query, key_cache, value_cache, page_table, seq_lens, scale)
    batch, num_q_heads, head_dim = query.shape
    num_pages, page_size, num_kv_heads = key_cache.shape[:3]
    assert key_cache.shape[3] == head_dim and num_q_heads % num_kv_heads == 0, (
        f"query {tuple(query.shape)} vs cache {tuple(key_cache.shape)}"
    )
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.dtype.is_floating_point, "int8 KV: not in this kernel yet (use the reference)"
    assert key_cache.stride(3) == 1 and query.stride(2) == 1
    assert page_table.shape[0] == batch and seq_lens.shape == (batch,) and page_table.stride(1) == 1
    group = num_q_heads // num_kv_heads
    block_n = 64 if head_dim <= 128 else 32
    capacity = page_table.shape[1] * page_size
    if num_splits is None:
        # ~2 programs per SM on a 132-SM part, at least 128 keys a split. H200, 24/4 x 256, L=8192, 16
        # layers' caches: B=1 17.5 us at 64 splits (20.1 at 32, 45 at 256); B=8 68 us at 8 splits.
        num_splits = max(1, min(triton.cdiv(256, batch * num_kv_heads), triton.cdiv(capacity, 128)))
    split_tokens = triton.cdiv(triton.cdiv(capacity, num_splits), block_n) * block_n
    num_splits = triton.cdiv(capacity, split_tokens)
    part_out = torch.empty(batch, num_q_heads, num_splits, head_dim, dtype=torch.float32, device=query.device)
    part_lse = torch.empty(batch, num_q_heads, num_splits, dtype=torch.float32, device=query.device)
    out = torch.empty(batch, num_q_heads, head_dim, dtype=query.dtype, device=query.device)
    if batch == 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    _paged_attention_decode_kernel[(batch, num_kv_heads, num_splits)](
        query, key_cache, value_cache, page_table, seq_lens, part_out, part_lse,
        query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        page_table.stride(0), split_tokens, num_splits, scale * 1.4426950408889634,
        NUM_Q_HEADS=num_q_heads, GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        BLOCK_G=max(16, triton.next_power_of_2(group)), BLOCK_N=block_n, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
    _paged_attention_reduce_kernel[(batch, num_q_heads)](
        part_out, part_lse, out, out.stride(0), out.stride(1), num_splits,
        NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, BLOCK_S=triton.next_power_of_2(num_splits), BLOCK_D=block_d,
    )  # fmt: skip
    return out
