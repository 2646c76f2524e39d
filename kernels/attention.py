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
``gather_kv_ref``, which dequantises there: the attention math never sees codes. The Triton
``store_kv`` quantises the same way (bit-exact), and the Triton decode kernel dequantises each K/V tile
in registers (codes times the group's scale in fp32, then the query dtype for the tensor-core dots).

Prefill (and mixed steps): ``paged_prefill_attention`` runs ``paged_attention_ref``'s contract as one
FlashAttention-2 launch over the flat varlen batch, reading K/V straight from the pages (no gather, no
K/V repeated per query head; int8 pages dequantised in registers), with no host sync.

Decode is batch-invariant: ``paged_attention_decode`` cuts a sequence's keys into splits by a rule of
that sequence's length alone and merges them in a fixed order, so a sequence's output is bitwise the
same whichever other sequences (or padding rows) share its batch and however wide the page table is.
"""

from __future__ import annotations

from typing import NamedTuple

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
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: ``paged_attention_ref`` with exactly one new token per sequence.

    query: [B, Hq, D] (sequence b's token is at position seq_lens[b] - 1); caches: [num_pages,
    page_size, Hkv, D] in a float dtype, or int8 codes with key_scale/value_scale ([num_pages,
    page_size, Hkv, G] fp16, see ``store_kv_ref``); page_table: [B, max_pages]; seq_lens: [B] (a
    sequence of 0 keys gets zeros) -> out [B, Hq, D] in query.dtype.
    """
    cu_seqlens_q = torch.arange(query.shape[0] + 1, device=query.device)
    return paged_attention_ref(
        query, key_cache, value_cache, page_table, cu_seqlens_q, seq_lens, scale, key_scale, value_scale
    )


def paged_prefill_attention_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Prefill / mixed-step attention: ``paged_attention_ref`` itself (any query lengths, cached prefixes
    included), under the name of its Triton launcher ``paged_prefill_attention``.

    query: [T, Hq, D]; caches: [num_pages, page_size, Hkv, D] (float, or int8 codes with
    key_scale/value_scale); page_table: [B, max_pages]; query_start_loc: [B + 1] (cu_seqlens_q); seq_lens:
    [B] cached + new tokens -> out [T, Hq, D] in query.dtype.
    """
    return paged_attention_ref(
        query, key_cache, value_cache, page_table, query_start_loc, seq_lens, scale, key_scale, value_scale
    )


DECODE_MAX_SPLITS = 64  # the most splits one sequence's keys are cut into (the reduce kernel's BLOCK_S)


def decode_block_n(head_dim: int) -> int:
    """Keys per tile of the decode kernel (and its default split unit): 64, or 32 for heads over 128."""
    return 64 if head_dim <= 128 else 32


def decode_split_tokens(seq_len: int, split_unit: int, max_splits: int = DECODE_MAX_SPLITS) -> int:
    """Keys per split of a sequence of ``seq_len`` keys: the fewest whole ``split_unit``s that cut it
    into at most ``max_splits`` splits. A function of the sequence's own length only (the decode and reduce
    kernels compute the same); its splits are ``[i * n, min((i + 1) * n, seq_len))``."""
    units = -(-seq_len // split_unit)
    return max(1, -(-units // max_splits)) * split_unit


class PrefillTiles(NamedTuple):
    """Launch shape of the prefill kernel: BLOCK_M flattened (token, head) query rows, BLOCK_N keys a tile."""

    block_m: int
    block_n: int
    num_warps: int
    num_stages: int


def prefill_tiles(
    head_dim: int, dtype: torch.dtype, capability: tuple[int, int] = (9, 0), kv_int8: bool = False
) -> PrefillTiles:
    """The prefill kernel's tiles for a query dtype on a GPU of ``capability`` (major, minor).

    Checked with an sm_90 compile (Triton 3.6, strides divisible by 16 as the runtime specialises them;
    the numbers below are from that, not measured speed): at head_dim 256, 128 rows x 64 keys, 8 warps
    (16 rows a warp; the [128, 256] fp32 accumulator is 128 registers a thread), 2 stages: wgmma, cp.async
    double buffering, 255 registers with 2 spill stores (8 B of stack at group 6, 48 B at group 8), 192 KiB
    of shared memory (the Q tile and two K+V stages; sm_90 allows 227 KiB): one program an SM. int8 pages
    (dequantised in registers): 64 keys spill 80 B, 32 keys with 3 stages 40 B: 128 x 32. At head_dim
    <= 128, 64 keys with 3 stages (187 registers, 98 KiB). Other GPUs (sm_80/86/89/120, 99-163 KiB of
    shared memory): 64 x 32, 4 warps, 2 stages (68 KiB). fp32 (tests, tiny models) runs exact fp32 dots on
    the FMA units: 16 x 16, 4 warps (32 x 32 makes ptxas spill kilobytes).
    """
    if dtype == torch.float32:
        return PrefillTiles(16, 16, 4, 2)
    if capability[0] in (9, 10):
        if kv_int8:
            return PrefillTiles(128, 32, 8, 3)
        return PrefillTiles(128, 64, 8, 2 if head_dim > 128 else 3)
    return PrefillTiles(64, 32, 4, 2)


# ---------------------------------------------------------------------------------------------------
# Triton

if HAS_TRITON:

    @triton.jit
    def _quantize_store_row(
        src_ptr,
        dst_ptr,
        scale_dst_ptr,
        SCALE_GROUP: tl.constexpr,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        BLOCK_GROUP: tl.constexpr,
    ):
        # quantize_kv_int8_ref for one head row, bit for bit: the row as [groups, values per group].
        offs_s = tl.arange(0, BLOCK_SCALES)
        offs_j = tl.arange(0, BLOCK_GROUP)
        offs = offs_s[:, None] * SCALE_GROUP + offs_j[None, :]
        s_mask = offs_s < NUM_SCALES
        mask = s_mask[:, None] & (offs_j < SCALE_GROUP)[None, :]
        x = tl.load(src_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        # NOTE: div_rn, not `/` (an approximate division on the GPU): the codes must match torch's.
        scale = tl.math.div_rn(tl.max(tl.abs(x), axis=1), 127.0).to(tl.float16)  # [BLOCK_SCALES]
        safe = tl.maximum(scale.to(tl.float32), 6.103515625e-05)  # fp16's smallest normal, as the reference
        y = tl.math.div_rn(x, safe[:, None])
        # round half to even (torch.round) without libdevice, which the interpreter lacks: |y| <= ~127, so
        # adding 1.5 * 2^23 leaves no fraction bits and the fp32 add rounds to nearest even; the subtraction
        # is exact.
        y = (y + 12582912.0) - 12582912.0
        codes = tl.minimum(tl.maximum(y, -127.0), 127.0).to(tl.int8)
        tl.store(dst_ptr + offs, codes, mask=mask)
        tl.store(scale_dst_ptr + offs_s, scale, mask=s_mask)

    @triton.jit
    def _store_kv_kernel(
        key_ptr,
        value_ptr,
        key_cache_ptr,
        value_cache_ptr,
        key_scale_ptr,
        value_scale_ptr,
        slot_mapping_ptr,
        key_stride_t,
        key_stride_h,
        value_stride_t,
        value_stride_h,
        cache_stride_slot,
        cache_stride_head,
        scale_stride_slot,
        scale_stride_head,
        HEAD_DIM: tl.constexpr,
        KV_INT8: tl.constexpr,
        SCALE_GROUP: tl.constexpr,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        BLOCK_GROUP: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # grid (T, Hkv): one program writes one token's key and value row for one KV head into its slot:
        # a copy (cast to the cache dtype), or with KV_INT8 int8 codes plus one fp16 scale per group.
        token = tl.program_id(0)
        head = tl.program_id(1)
        slot = tl.load(slot_mapping_ptr + token).to(tl.int64)
        if slot < 0:
            return
        key_src = key_ptr + token * key_stride_t + head * key_stride_h
        value_src = value_ptr + token * value_stride_t + head * value_stride_h
        dst = slot * cache_stride_slot + head * cache_stride_head
        if KV_INT8:
            scale_dst = slot * scale_stride_slot + head * scale_stride_head
            _quantize_store_row(
                key_src, key_cache_ptr + dst, key_scale_ptr + scale_dst,
                SCALE_GROUP, NUM_SCALES, BLOCK_SCALES, BLOCK_GROUP,
            )  # fmt: skip
            _quantize_store_row(
                value_src, value_cache_ptr + dst, value_scale_ptr + scale_dst,
                SCALE_GROUP, NUM_SCALES, BLOCK_SCALES, BLOCK_GROUP,
            )  # fmt: skip
        else:
            offs = tl.arange(0, BLOCK_D)
            mask = offs < HEAD_DIM
            key = tl.load(key_src + offs, mask=mask)
            tl.store(key_cache_ptr + dst + offs, key.to(key_cache_ptr.dtype.element_ty), mask=mask)
            value = tl.load(value_src + offs, mask=mask)
            tl.store(value_cache_ptr + dst + offs, value.to(value_cache_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _dequantize_tile(
        codes,
        scale_ptr,
        scale_rows,
        t_mask,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # codes int8 [BLOCK_N, BLOCK_D] -> fp32, each group of BLOCK_D // BLOCK_SCALES columns times its
        # row's fp16 scale. BLOCK_D = BLOCK_SCALES * next_pow2(values per group) holds for every head_dim
        # kv_int8_group_size accepts (a multiple of 64, or one group under 64), so column d is in group
        # d // (BLOCK_D // BLOCK_SCALES); padded groups and rows load scale 0 (their codes are 0 too).
        offs_s = tl.arange(0, BLOCK_SCALES)
        scales = tl.load(
            scale_ptr + scale_rows[:, None] + offs_s[None, :],
            mask=t_mask[:, None] & (offs_s < NUM_SCALES)[None, :],
            other=0.0,
        ).to(tl.float32)
        groups = tl.reshape(codes.to(tl.float32), (BLOCK_N, BLOCK_SCALES, BLOCK_D // BLOCK_SCALES))
        return tl.reshape(groups * scales[:, :, None], (BLOCK_N, BLOCK_D))

    @triton.jit
    def _paged_attention_decode_kernel(
        q_ptr,
        key_cache_ptr,
        value_cache_ptr,
        key_scale_ptr,
        value_scale_ptr,
        page_table_ptr,
        seq_lens_ptr,
        part_out_ptr,
        part_lse_ptr,
        q_stride_b,
        q_stride_h,
        cache_stride_page,
        cache_stride_row,
        cache_stride_head,
        scale_stride_page,
        scale_stride_row,
        scale_stride_head,
        page_table_stride,
        part_splits,
        scale_log2,
        NUM_Q_HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE_SIZE: tl.constexpr,
        KV_INT8: tl.constexpr,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        SPLIT_UNIT: tl.constexpr,
        MAX_SPLITS: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # grid (B, Hkv, part_splits): one program runs online softmax for the GROUP query heads that share
        # one KV head, over one split of the sequence's keys (each K/V row read once, for all heads), and
        # writes the split's normalised output and log2-sum-exp for _paged_attention_reduce_kernel. The
        # split's bounds come from the sequence's length alone (decode_split_tokens); programs past the
        # sequence's last split exit at once and write nothing. With KV_INT8 the caches hold int8 codes,
        # dequantised per tile in registers (fp32), then cast to the query dtype for the dots.
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + row)
        # decode_split_tokens: a function of the sequence's own length, never of the batch. (Written out
        # here and in the reduce kernel, without tl.cdiv or a helper: the interpreter pays ~4 ms a jit call.)
        units = (seq_len + SPLIT_UNIT - 1) // SPLIT_UNIT
        split_tokens = tl.maximum((units + MAX_SPLITS - 1) // MAX_SPLITS, 1) * SPLIT_UNIT
        start = split * split_tokens
        if start >= seq_len:
            return
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
            ).to(tl.int64)
            rows = pages * cache_stride_page + (toks % PAGE_SIZE) * cache_stride_row
            kv_offs = (rows + kv_head * cache_stride_head)[:, None] + offs_d[None, :]
            kv_mask = t_mask[:, None] & d_mask[None, :]
            keys = tl.load(key_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
            if KV_INT8:
                scale_rows = (
                    pages * scale_stride_page
                    + (toks % PAGE_SIZE) * scale_stride_row
                    + kv_head * scale_stride_head
                )
                keys = _dequantize_tile(
                    keys, key_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N, BLOCK_D
                ).to(q.dtype)
            scores = tl.dot(q, tl.trans(keys)) * scale_log2  # [BLOCK_G, BLOCK_N], log2 domain
            scores = tl.where(t_mask[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            values = tl.load(value_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
            if KV_INT8:
                values = _dequantize_tile(
                    values, value_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N, BLOCK_D
                ).to(q.dtype)
            acc = acc * alpha[:, None] + tl.dot(p.to(values.dtype), values)
            m = m_new
        part = (row * NUM_Q_HEADS + heads) * part_splits + split  # [BLOCK_G]
        out = acc / tl.maximum(l_sum, 1e-30)[:, None]
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + offs_d[None, :],
            out,
            mask=g_mask[:, None] & d_mask[None, :],
        )
        tl.store(part_lse_ptr + part, m + tl.log2(l_sum), mask=g_mask)

    @triton.jit
    def _paged_attention_reduce_kernel(
        part_out_ptr,
        part_lse_ptr,
        seq_lens_ptr,
        out_ptr,
        out_stride_b,
        out_stride_h,
        part_splits,
        NUM_Q_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        SPLIT_UNIT: tl.constexpr,
        MAX_SPLITS: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # grid (B, Hq, cdiv(HEAD_DIM, BLOCK_D)): one program merges the splits of one query head over
        # BLOCK_D columns (weights 2^(lse - max lse)). The sequence's split count comes from its length, as
        # in the decode kernel; BLOCK_S is a constant (not the grid's split count), so the sums over splits
        # are one fixed reduction tree whatever the batch or the page table's width. A sequence of no keys
        # has no splits and gets zeros.
        row = tl.program_id(0)
        head = tl.program_id(1)
        d_block = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + row)
        units = (seq_len + SPLIT_UNIT - 1) // SPLIT_UNIT
        split_tokens = tl.maximum((units + MAX_SPLITS - 1) // MAX_SPLITS, 1) * SPLIT_UNIT
        num_splits = tl.minimum((seq_len + split_tokens - 1) // split_tokens, part_splits)
        offs_s = tl.arange(0, BLOCK_S)
        offs_d = d_block * BLOCK_D + tl.arange(0, BLOCK_D)
        s_mask = offs_s < num_splits
        d_mask = offs_d < HEAD_DIM
        base = (row * NUM_Q_HEADS + head) * part_splits
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

    @triton.jit
    def _prefill_attention_tiles(
        acc,
        l_sum,
        m,
        q,
        q_pos,
        key_cache_ptr,
        value_cache_ptr,
        key_scale_ptr,
        value_scale_ptr,
        page_row_ptr,
        kv_head,
        seq_len,
        start,
        end,
        scale_log2,
        cache_stride_page,
        cache_stride_row,
        cache_stride_head,
        scale_stride_page,
        scale_stride_row,
        scale_stride_head,
        CAUSAL: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE_SIZE: tl.constexpr,
        KV_INT8: tl.constexpr,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # Online softmax of the query tile q [BLOCK_M, BLOCK_D] over keys [start, end) of one sequence, one
        # BLOCK_N tile at a time. When BLOCK_N divides PAGE_SIZE (page size 64) a tile lies in one page: one
        # page-table entry gives the tile's base offset, added to a loop-invariant [BLOCK_N, BLOCK_D] offset
        # tile; otherwise (any other page size) each key's page is looked up.
        # CAUSAL: the diagonal tiles, where key k counts for row i only when k <= q_pos[i] (k < seq_len follows);
        # without it every key of [start, end) is visible to every row (end <= the tile's first position + 1),
        # so neither the keys nor the scores need a mask.
        offs_n = tl.arange(0, BLOCK_N)
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < HEAD_DIM
        page_tile = offs_n[:, None] * cache_stride_row + offs_d[None, :]  # one page's rows of one head
        for tok0 in range(start, end, BLOCK_N):
            toks = tok0 + offs_n
            t_mask = toks < seq_len
            if CAUSAL:
                kv_mask = t_mask[:, None] & d_mask[None, :]
            else:
                kv_mask = d_mask[None, :]
            if PAGE_SIZE % BLOCK_N == 0:  # tok0 < end <= seq_len: its page is the sequence's
                page = tl.load(page_row_ptr + tok0 // PAGE_SIZE).to(tl.int64)
                row_base = page * cache_stride_page + (tok0 % PAGE_SIZE) * cache_stride_row
                kv_offs = row_base + kv_head * cache_stride_head + page_tile
                if KV_INT8:
                    scale_rows = (
                        page * scale_stride_page
                        + (tok0 % PAGE_SIZE + offs_n) * scale_stride_row
                        + kv_head * scale_stride_head
                    )
            else:
                pages = tl.load(page_row_ptr + toks // PAGE_SIZE, mask=t_mask, other=0).to(tl.int64)
                rows = (
                    pages * cache_stride_page
                    + (toks % PAGE_SIZE) * cache_stride_row
                    + kv_head * cache_stride_head
                )
                kv_offs = rows[:, None] + offs_d[None, :]
                if KV_INT8:
                    scale_rows = (
                        pages * scale_stride_page
                        + (toks % PAGE_SIZE) * scale_stride_row
                        + kv_head * scale_stride_head
                    )
            if CAUSAL or BLOCK_D != HEAD_DIM:
                keys = tl.load(key_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
            else:
                keys = tl.load(key_cache_ptr + kv_offs)
            if KV_INT8:
                keys = _dequantize_tile(
                    keys, key_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N, BLOCK_D
                ).to(q.dtype)
            if q.dtype == tl.float32:  # exact fp32 (the fp32 model's path), not TF32
                scores = tl.dot(q, tl.trans(keys), input_precision="ieee")
            else:
                scores = tl.dot(q, tl.trans(keys))
            scores = scores * scale_log2  # [BLOCK_M, BLOCK_N], log2 domain
            if CAUSAL:
                scores = tl.where(toks[None, :] <= q_pos[:, None], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            if CAUSAL or BLOCK_D != HEAD_DIM:
                values = tl.load(value_cache_ptr + kv_offs, mask=kv_mask, other=0.0)
            else:
                values = tl.load(value_cache_ptr + kv_offs)
            if KV_INT8:
                values = _dequantize_tile(
                    values, value_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N, BLOCK_D
                ).to(q.dtype)
            acc = acc * alpha[:, None]
            if q.dtype == tl.float32:
                acc = tl.dot(p, values, acc, input_precision="ieee")
            else:
                acc = tl.dot(p.to(values.dtype), values, acc)
            m = m_new
        return acc, l_sum, m

    # NOTE: the batch size is not specialised on (Triton would compile one variant for B = 1, one for B a
    # multiple of 16, ...): a new batch size must not cost a compile in the middle of serving.
    @triton.jit(do_not_specialize=["num_seqs", "search_steps"])
    def _paged_prefill_attention_kernel(
        q_ptr,
        key_cache_ptr,
        value_cache_ptr,
        key_scale_ptr,
        value_scale_ptr,
        page_table_ptr,
        query_start_loc_ptr,
        seq_lens_ptr,
        out_ptr,
        num_seqs,
        search_steps,
        q_stride_t,
        q_stride_h,
        out_stride_t,
        out_stride_h,
        cache_stride_page,
        cache_stride_row,
        cache_stride_head,
        scale_stride_page,
        scale_stride_row,
        scale_stride_head,
        page_table_stride,
        scale_log2,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE_SIZE: tl.constexpr,
        KV_INT8: tl.constexpr,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # grid (T * GROUP // BLOCK_M + B, Hkv): FlashAttention-2 forward over paged K/V. A sequence's query
        # rows are its (token, head-of-the-group) pairs, token-major (row r = token r // GROUP, query head
        # kv_head * GROUP + r % GROUP), so each K/V tile a program loads serves all GROUP heads of its KV
        # head (GQA without repeating K/V). Sequence b owns tile ids [cu[b] * GROUP // BLOCK_M + b,
        # cu[b + 1] * GROUP // BLOCK_M + b + 1): enough for its rows, the spare ones exit at once, so the
        # grid comes from shapes (no host sync); a program finds its sequence by binary search over those
        # starts. Program 0 takes the last tile id (the batch's last sequence's last tile: the most keys), so
        # the heavy tiles start first. A tile's keys: [0, its first position] in full tiles without masks,
        # then the diagonal tiles up to its last position with the causal mask.
        tile_id = tl.num_programs(0) - 1 - tl.program_id(0)
        kv_head = tl.program_id(1)
        lo = tile_id * 0
        hi = lo + num_seqs
        for _ in range(search_steps):  # ceil(log2(B)) halvings: the last sequence starting at or before
            mid = (lo + hi) // 2
            go = tl.load(query_start_loc_ptr + mid) * GROUP // BLOCK_M + mid <= tile_id
            lo = tl.where(go, mid, lo)
            hi = tl.where(go, hi, mid)
        seq = lo
        q_start = tl.load(query_start_loc_ptr + seq).to(tl.int32)
        q_len = tl.load(query_start_loc_ptr + seq + 1).to(tl.int32) - q_start
        row0 = (tile_id - (q_start * GROUP // BLOCK_M + seq)) * BLOCK_M
        if row0 >= q_len * GROUP:
            return
        seq_len = tl.load(seq_lens_ptr + seq).to(tl.int32)
        first_pos = seq_len - q_len  # absolute position of the sequence's first new token
        rows = row0 + tl.arange(0, BLOCK_M)
        row_mask = rows < q_len * GROUP
        # rows past the sequence's end repeat its last token (never stored): no row is without keys
        tok = tl.minimum(rows // GROUP, q_len - 1)
        heads = kv_head * GROUP + rows % GROUP
        q_pos = first_pos + tok
        offs_d = tl.arange(0, BLOCK_D)
        d_mask = offs_d < HEAD_DIM
        q = tl.load(
            q_ptr + (q_start + tok).to(tl.int64)[:, None] * q_stride_t + (heads * q_stride_h)[:, None]
            + offs_d[None, :],
            mask=row_mask[:, None] & d_mask[None, :],
            other=0.0,
        )  # fmt: skip
        m = tl.full([BLOCK_M], float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros([BLOCK_M], dtype=tl.float32)
        acc = tl.zeros([BLOCK_M, BLOCK_D], dtype=tl.float32)
        pos_lo = first_pos + row0 // GROUP  # the tile's first and last positions
        pos_hi = first_pos + tl.minimum((row0 + BLOCK_M - 1) // GROUP, q_len - 1)
        full_end = (pos_lo + 1) // BLOCK_N * BLOCK_N  # keys [0, full_end) are visible to every row
        page_row_ptr = page_table_ptr + seq.to(tl.int64) * page_table_stride
        acc, l_sum, m = _prefill_attention_tiles(
            acc, l_sum, m, q, q_pos, key_cache_ptr, value_cache_ptr, key_scale_ptr, value_scale_ptr, page_row_ptr,
            kv_head, seq_len, 0, full_end, scale_log2, cache_stride_page, cache_stride_row, cache_stride_head,
            scale_stride_page, scale_stride_row, scale_stride_head,
            False, HEAD_DIM, PAGE_SIZE, KV_INT8, NUM_SCALES, BLOCK_SCALES, BLOCK_N, BLOCK_D,
        )  # fmt: skip
        acc, l_sum, m = _prefill_attention_tiles(
            acc, l_sum, m, q, q_pos, key_cache_ptr, value_cache_ptr, key_scale_ptr, value_scale_ptr, page_row_ptr,
            kv_head, seq_len, full_end, pos_hi + 1, scale_log2, cache_stride_page, cache_stride_row,
            cache_stride_head, scale_stride_page, scale_stride_row, scale_stride_head,
            True, HEAD_DIM, PAGE_SIZE, KV_INT8, NUM_SCALES, BLOCK_SCALES, BLOCK_N, BLOCK_D,
        )  # fmt: skip
        out = acc / l_sum[:, None]
        tl.store(
            out_ptr + (q_start + tok).to(tl.int64)[:, None] * out_stride_t + (heads * out_stride_h)[:, None]
            + offs_d[None, :],
            out.to(out_ptr.dtype.element_ty),
            mask=row_mask[:, None] & d_mask[None, :],
        )  # fmt: skip


def _int8_scales(
    key_cache: torch.Tensor, key_scale: torch.Tensor | None, value_scale: torch.Tensor | None
) -> int:
    """Validate an int8 cache's scale tensors; the number of scales per head row (1 for a float cache)."""
    assert (key_scale is None) == (value_scale is None), "int8 KV needs both key_scale and value_scale"
    if key_scale is None or value_scale is None:
        assert key_cache.dtype.is_floating_point, f"{key_cache.dtype} cache without scales"
        return 1
    head_dim = key_cache.shape[3]
    num_scales = head_dim // kv_int8_group_size(head_dim)
    assert key_cache.dtype == torch.int8 and key_scale.dtype == value_scale.dtype == torch.float16
    assert key_scale.shape == value_scale.shape == (*key_cache.shape[:3], num_scales), (
        f"scales {tuple(key_scale.shape)} for cache {tuple(key_cache.shape)}"
    )
    assert key_scale.stride() == value_scale.stride() and key_scale.stride(3) == 1
    return num_scales


def store_kv(
    key: torch.Tensor,
    value: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
) -> None:
    """Launcher for ``store_kv_ref`` (same contract, bit-exact, int8 quantisation included)."""
    if not use_triton(key, value, key_cache, value_cache, slot_mapping, key_scale, value_scale):
        store_kv_ref(key, value, key_cache, value_cache, slot_mapping, key_scale, value_scale)
        return
    num_tokens, num_kv_heads, head_dim = key.shape
    assert value.shape == key.shape, f"value {tuple(value.shape)} != key {tuple(key.shape)}"
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.shape[2:] == (num_kv_heads, head_dim), f"cache {tuple(key_cache.shape)}"
    assert key_cache.stride(0) == key_cache.shape[1] * key_cache.stride(1), "pages must tile the slot axis"
    assert key_cache.stride(3) == 1 and key.stride(2) == 1 and value.stride(2) == 1
    assert slot_mapping.shape == (num_tokens,)
    num_scales = _int8_scales(key_cache, key_scale, value_scale)
    if key_scale is not None and value_scale is not None:
        assert key_scale.stride(0) == key_scale.shape[1] * key_scale.stride(1), "pages must tile the slots"
        scale_args = (key_scale, value_scale, key_scale.stride(1), key_scale.stride(2))
        group = head_dim // num_scales
    else:
        scale_args, group = (key_cache, value_cache, 0, 0), head_dim  # placeholders: KV_INT8 is off
    if num_tokens:
        _store_kv_kernel[(num_tokens, num_kv_heads)](
            key, value, key_cache, value_cache, scale_args[0], scale_args[1], slot_mapping,
            key.stride(0), key.stride(1), value.stride(0), value.stride(1), key_cache.stride(1), key_cache.stride(2),
            scale_args[2], scale_args[3],
            HEAD_DIM=head_dim, KV_INT8=key_scale is not None, SCALE_GROUP=group, NUM_SCALES=num_scales,
            BLOCK_SCALES=triton.next_power_of_2(num_scales), BLOCK_GROUP=triton.next_power_of_2(group),
            BLOCK_D=triton.next_power_of_2(head_dim),
        )  # fmt: skip


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
    *,
    max_splits: int = DECODE_MAX_SPLITS,
    split_unit: int | None = None,
) -> torch.Tensor:
    """Launcher for ``paged_attention_decode_ref`` (same contract; split-K "flash decoding"), float or
    int8 KV (int8: pass the scales; tiles are dequantised in registers).

    Batch invariance: sequence ``b``'s keys are cut into splits of ``decode_split_tokens(seq_lens[b],
    split_unit, max_splits)`` keys, a function of its own length only, and the reduce kernel merges its
    splits over a constant ``BLOCK_S = next_pow2(max_splits)`` (one fixed reduction tree). Nothing a
    sequence's output goes through depends on the batch size, on the other rows (CUDA-graph padding
    rows included) or on the page table's width, so it is bitwise the same alone or batched.

    The split rule, and its trade-off: a split is the fewest whole ``split_unit``s (default one tile,
    ``decode_block_n``: 32 keys at head_dim 256) that keep a sequence at ``max_splits`` (64) splits or
    fewer. Short sequences get one-tile splits, for parallelism where it is scarce: batch 1, 4 KV heads,
    1k keys = 32 splits = 128 programs; 2k-8k keys = 64 splits = 256 programs (~2 per SM on 132 SMs;
    64 splits at 8k was the measured best of the old batch-dependent choice). Long sequences get longer
    splits, never more of them: 128k keys = 64 splits of 2048, so BLOCK_S and the partial buffers
    ([B, Hq, <= 64, D] fp32, 1.5 MiB a row at 24 x 256) stay bounded whatever the capacity. The cost: a
    large batch no longer trades splits for rows (the old rule used 8 splits at B=8), so at B=8, 8k keys it
    runs 2048 programs of 128 keys and moves ~9% extra bytes as partials (mostly in L2); the reduce reads
    64 partials a head where 8 would do. One fixed split length could not serve both ends (1k keys need
    splits of 32 for 128 programs; 128k keys would then be 4096 splits), hence a split length that grows
    with the sequence's own length. ``max_splits``/``split_unit`` are tuning knobs (constants across a
    deployment: varying them per call would break the invariance).

    The grid is sized from shapes only (``min(max_splits, cdiv(capacity, split_unit))`` splits), so the
    launch needs no host sync and can be captured in a CUDA graph; programs past a sequence's last
    split exit at once.
    """
    if not use_triton(query, key_cache, value_cache, page_table, seq_lens, key_scale, value_scale):
        return paged_attention_decode_ref(
            query, key_cache, value_cache, page_table, seq_lens, scale, key_scale, value_scale
        )
    batch, num_q_heads, head_dim = query.shape
    num_pages, page_size, num_kv_heads = key_cache.shape[:3]
    assert key_cache.shape[3] == head_dim and num_q_heads % num_kv_heads == 0, (
        f"query {tuple(query.shape)} vs cache {tuple(key_cache.shape)}"
    )
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.stride(3) == 1 and query.stride(2) == 1
    assert page_table.shape[0] == batch and seq_lens.shape == (batch,) and page_table.stride(1) == 1
    num_scales = _int8_scales(key_cache, key_scale, value_scale)
    block_n = decode_block_n(head_dim)
    split_unit = block_n if split_unit is None else split_unit
    assert split_unit % block_n == 0 and max_splits >= 1, f"split_unit={split_unit}, max_splits={max_splits}"
    capacity = page_table.shape[1] * page_size
    part_splits = max(1, min(max_splits, triton.cdiv(capacity, split_unit)))
    part_out = torch.empty(
        batch, num_q_heads, part_splits, head_dim, dtype=torch.float32, device=query.device
    )
    part_lse = torch.empty(batch, num_q_heads, part_splits, dtype=torch.float32, device=query.device)
    out = torch.empty(batch, num_q_heads, head_dim, dtype=query.dtype, device=query.device)
    if batch == 0:
        return out
    if key_scale is not None:
        scale_args = (key_scale, value_scale, key_scale.stride(0), key_scale.stride(1), key_scale.stride(2))
    else:
        scale_args = (key_cache, value_cache, 0, 0, 0)  # placeholders: KV_INT8 is off
    block_d, group = triton.next_power_of_2(head_dim), num_q_heads // num_kv_heads
    _paged_attention_decode_kernel[(batch, num_kv_heads, part_splits)](
        query, key_cache, value_cache, scale_args[0], scale_args[1], page_table, seq_lens, part_out, part_lse,
        query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        *scale_args[2:], page_table.stride(0), part_splits, scale * 1.4426950408889634,
        NUM_Q_HEADS=num_q_heads, GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size,
        KV_INT8=key_scale is not None, NUM_SCALES=num_scales, BLOCK_SCALES=triton.next_power_of_2(num_scales),
        SPLIT_UNIT=split_unit, MAX_SPLITS=max_splits, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, BLOCK_D=block_d, num_warps=4,
    )  # fmt: skip
    reduce_block_d = min(64, block_d)
    _paged_attention_reduce_kernel[(batch, num_q_heads, triton.cdiv(head_dim, reduce_block_d))](
        part_out, part_lse, seq_lens, out, out.stride(0), out.stride(1), part_splits,
        NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, SPLIT_UNIT=split_unit, MAX_SPLITS=max_splits,
        BLOCK_S=triton.next_power_of_2(max_splits), BLOCK_D=reduce_block_d,
    )  # fmt: skip
    return out


def _launch_paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    key_scale: torch.Tensor | None,
    value_scale: torch.Tensor | None,
    tiles: PrefillTiles | None = None,
) -> torch.Tensor:
    """Validates, allocates the output, launches ``_paged_prefill_attention_kernel`` (``tiles``: the
    launcher's ``prefill_tiles`` choice unless given, for sweeps)."""
    num_tokens, num_q_heads, head_dim = query.shape
    page_size, num_kv_heads = key_cache.shape[1:3]
    batch = seq_lens.shape[0]
    assert key_cache.shape[3] == head_dim and num_q_heads % num_kv_heads == 0, (
        f"query {tuple(query.shape)} vs cache {tuple(key_cache.shape)}"
    )
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.stride(3) == 1 and query.stride(2) == 1
    assert query.dtype in (torch.bfloat16, torch.float16, torch.float32), f"query dtype {query.dtype}"
    assert key_cache.dtype in (query.dtype, torch.int8), f"{key_cache.dtype} cache for {query.dtype} queries"
    assert page_table.shape[0] == batch and page_table.stride(1) == 1, f"page_table {tuple(page_table.shape)}"
    assert query_start_loc.shape == (batch + 1,) and query_start_loc.is_contiguous()
    assert seq_lens.is_contiguous(), "seq_lens must be contiguous"
    num_scales = _int8_scales(key_cache, key_scale, value_scale)
    if tiles is None:
        capability = torch.cuda.get_device_capability(query.device) if query.is_cuda else (9, 0)
        tiles = prefill_tiles(head_dim, query.dtype, capability, key_scale is not None)
    out = torch.empty(num_tokens, num_q_heads, head_dim, dtype=query.dtype, device=query.device)
    if num_tokens == 0 or batch == 0:
        return out
    if key_scale is not None:
        scale_args = (key_scale, value_scale, key_scale.stride(0), key_scale.stride(1), key_scale.stride(2))
    else:
        scale_args = (key_cache, value_cache, 0, 0, 0)  # placeholders: KV_INT8 is off
    group = num_q_heads // num_kv_heads
    grid = (num_tokens * group // tiles.block_m + batch, num_kv_heads)
    _paged_prefill_attention_kernel[grid](
        query, key_cache, value_cache, scale_args[0], scale_args[1], page_table, query_start_loc, seq_lens, out,
        batch, max(batch - 1, 0).bit_length(), query.stride(0), query.stride(1), out.stride(0), out.stride(1),
        key_cache.stride(0), key_cache.stride(1), key_cache.stride(2), *scale_args[2:], page_table.stride(0),
        scale * 1.4426950408889634,
        GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size, KV_INT8=key_scale is not None,
        NUM_SCALES=num_scales, BLOCK_SCALES=triton.next_power_of_2(num_scales), BLOCK_M=tiles.block_m,
        BLOCK_N=tiles.block_n, BLOCK_D=max(16, triton.next_power_of_2(head_dim)),
        num_warps=tiles.num_warps, num_stages=tiles.num_stages,
    )  # fmt: skip
    return out


def paged_prefill_attention(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    query_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launcher for ``paged_prefill_attention_ref`` (same contract: a varlen batch of fresh prompts,
    continuing chunks and decode rows alike; float or int8 KV): FlashAttention-2 forward reading K/V
    straight from the pages.

    One program holds BLOCK_M query rows of one sequence and one KV head in registers, rows being
    (token, query head of the group) pairs, and streams the sequence's K/V tiles through the page table
    (each tile read once for the whole group, never repeated per query head), with the online softmax in
    fp32 (log2 domain) and the causal mask only on the diagonal tiles. int8 pages are dequantised in
    registers (as in the decode kernel). fp32 queries get exact fp32 dots (no TF32). The grid is sized
    from shapes (``T * group // BLOCK_M + B`` tiles x Hkv; see the kernel), so there is no host sync;
    rows past ``query_start_loc[-1]`` are left unwritten. Tiles: ``prefill_tiles``.
    """
    if not use_triton(
        query, key_cache, value_cache, page_table, query_start_loc, seq_lens, key_scale, value_scale
    ):
        return paged_prefill_attention_ref(
            query,
            key_cache,
            value_cache,
            page_table,
            query_start_loc,
            seq_lens,
            scale,
            key_scale,
            value_scale,
        )
    return _launch_paged_prefill_attention(
        query, key_cache, value_cache, page_table, query_start_loc, seq_lens, scale, key_scale, value_scale
    )
