"""``paged_prefill_attention``: prefill and mixed steps, one FlashAttention-2 launch over the flat varlen batch
reading K/V straight from the pages (int8 pages dequantised in registers), no host sync."""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels._dispatch import HAS_TRITON, use_triton
from kernels.attention.int8 import _int8_scales
from kernels.attention.ref import paged_attention_ref

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.attention.int8 import _dequantize_tile


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
