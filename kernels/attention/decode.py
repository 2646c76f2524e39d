"""``paged_attention_decode``: one new token per sequence, split-K ("flash decoding") over its pages, batch
invariant (a sequence's splits depend on its own length only)."""

from __future__ import annotations

import torch

from kernels import _dispatch
from kernels._dispatch import HAS_TRITON, INTERPRET, use_triton
from kernels.activation import sigmoid_gate_mul, sigmoid_gate_mul_ref
from kernels.attention.fuse import attn_fuse_enabled
from kernels.attention.int8 import _int8_scales
from kernels.attention.ref import paged_attention_ref
from kernels.pdl import pdl_args

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.attention.decode_int8 import (
        _paged_attention_decode_int8_kernel,
        _paged_attention_decode_int8_km_kernel,
    )
    from kernels.attention.int8 import _dequantize_tile, _dequantize_tile_f16
    from kernels.pdl import pdl_launch_dependents, pdl_wait


def paged_attention_decode_ref(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """Decode attention: ``paged_attention_ref`` with exactly one new token per sequence.

    query: [B, Hq, D] (sequence b's token is at position seq_lens[b] - 1); caches: [num_pages,
    page_size, Hkv, D] in a float dtype, or int8 codes with key_scale/value_scale ([num_pages,
    page_size, Hkv, G] fp16, see ``store_kv_ref``); page_table: [B, max_pages]; seq_lens: [B] (a
    sequence of 0 keys gets zeros) -> out [B, Hq, D] in query.dtype. With gate ([B, Hq, D], any token and head
    strides, unit stride along D: attention's output gate) the result is ``sigmoid_gate_mul_ref(out, gate)``.
    """
    cu_seqlens_q = torch.arange(query.shape[0] + 1, device=query.device)
    out = paged_attention_ref(
        query, key_cache, value_cache, page_table, cu_seqlens_q, seq_lens, scale, key_scale, value_scale
    )
    return out if gate is None else sigmoid_gate_mul_ref(out, gate)


# NOTE: bf16 / fp32 KV keep the tiles last measured fastest on an H200 (64 splits, decode_block_n). int8 KV with
# 16-bit queries runs decode_int8.py's kernel (the scales applied to the dots' results, no dequantised tile) with
# INT8_GROUPED_DEFAULTS; the older int8 paths (fp32 or ``int8_f16`` dequantised tiles) stay for fp32 queries and
# for bench/kernels/decode_attention.py's comparison. NEW_DEFAULTS is the bench's candidate row.
DECODE_MAX_SPLITS = 64  # the most splits one sequence's keys are cut into (the reduce kernel's BLOCK_S)
# int8 KV with 16-bit queries defaults to the grouped kernel with these tiles: on the H200 at 100k keys (27B
# geometry, bench/results/h200_2026-12-04_session9/decode_attention_int8_grouped.json) 128.8 us a layer at batch 1
# and 358.6 at batch 4, against 170.9 / 528.0 for the previous int8 default and 116.2 / 382.0 for bf16 (64 splits)
NEW_DEFAULTS = {"max_splits": 128, "int8_block_n": 64, "int8_f16": True, "int8_grouped": True}
INT8_GROUPED_DEFAULTS = {"block_n": 64, "max_splits": 128}
# the keys-major build of the grouped kernel (``int8_keys_major``, NINFER_INT8_ATTENTION=keys_major): the same tiles,
# capped at 128 registers (4 programs of 4 warps an SM by registers: 528 on the H200's 132 SMs, one wave for the
# 500 of batch 1 at 100k keys) with 2 pipeline stages. Not yet timed on this code (session 10's build of the idea:
# 85.7 us a layer vs bf16 104.1 at batch 1, 307.0 vs 383.1 at batch 4).
INT8_KEYS_MAJOR_LAUNCH = {"num_stages": 2, "maxnreg": 128}


def decode_block_n(head_dim: int, kv_int8: bool = False) -> int:
    """Keys per tile of the decode kernel (and its default split unit): 64, or 32 for heads over 128.
    (int8 KV with 16-bit queries takes 64 at any head, INT8_GROUPED_DEFAULTS.) An int8 tile of 64 keys is as many
    bytes as a bf16 tile of 32, and the per-tile work (page ids, scales, softmax bookkeeping) is spread over twice
    the keys: at head_dim 256 the sm_90 build issues ~19% fewer instructions per KV byte than with 32 keys (the int8 kernel is issue-bound,
    not memory-bound), in 250 registers without spills."""
    return 64 if head_dim <= 128 else 32


def decode_split_tokens(seq_len: int, split_unit: int, max_splits: int = DECODE_MAX_SPLITS) -> int:
    """Keys per split of a sequence of ``seq_len`` keys: the fewest whole ``split_unit``s that cut it
    into at most ``max_splits`` splits. A function of the sequence's own length only (the decode and reduce
    kernels compute the same); its splits are ``[i * n, min((i + 1) * n, seq_len))``."""
    units = -(-seq_len // split_unit)
    return max(1, -(-units // max_splits)) * split_unit


# ---------------------------------------------------------------------------------------------------
# Triton

if HAS_TRITON:

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
        INT8_F16: tl.constexpr,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        SPLIT_UNIT: tl.constexpr,
        MAX_SPLITS: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (B, Hkv, part_splits): one program runs online softmax for the GROUP query heads that share
        # one KV head, over one split of the sequence's keys (each K/V row read once, for all heads), and
        # writes the split's normalised output and log2-sum-exp for _paged_attention_reduce_kernel. The
        # split's bounds come from the sequence's length alone (decode_split_tokens); programs past the
        # sequence's last split exit at once and write nothing. With KV_INT8 the caches hold int8 codes,
        # dequantised per tile in registers: INT8_F16 (16-bit queries) in fp16, the query then in fp16 too
        # (clamped to its range) so the dots are fp16 x fp16; else in fp32, cast to the query dtype.
        # PDL (kernels/pdl.py): every program waits first (seq_lens, the page table, the query and the pages are a
        # predecessor's), then lets the reduce kernel launch.
        pdl_wait(PDL)
        pdl_launch_dependents(PDL)
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
        if INT8_F16:
            q = tl.minimum(tl.maximum(q.to(tl.float32), -65504.0), 65504.0).to(tl.float16)
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
                if INT8_F16:
                    keys = _dequantize_tile_f16(
                        keys, key_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N, BLOCK_D
                    )
                else:
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
                if INT8_F16:
                    values = _dequantize_tile_f16(
                        values,
                        value_scale_ptr,
                        scale_rows,
                        t_mask,
                        NUM_SCALES,
                        BLOCK_SCALES,
                        BLOCK_N,
                        BLOCK_D,
                    )
                else:
                    values = _dequantize_tile(
                        values,
                        value_scale_ptr,
                        scale_rows,
                        t_mask,
                        NUM_SCALES,
                        BLOCK_SCALES,
                        BLOCK_N,
                        BLOCK_D,
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
        gate_ptr,
        out_ptr,
        gate_stride_b,
        gate_stride_h,
        out_stride_b,
        out_stride_h,
        part_splits,
        NUM_Q_HEADS: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        SPLIT_UNIT: tl.constexpr,
        MAX_SPLITS: tl.constexpr,
        BLOCK_S: tl.constexpr,
        BLOCK_D: tl.constexpr,
        HAS_GATE: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (B, Hq, cdiv(HEAD_DIM, BLOCK_D)): one program merges the splits of one query head over
        # BLOCK_D columns (weights 2^(lse - max lse)). The sequence's split count comes from its length, as
        # in the decode kernel; BLOCK_S is a constant (not the grid's split count), so the sums over splits
        # are one fixed reduction tree whatever the batch or the page table's width. A sequence of no keys
        # has no splits and gets zeros. HAS_GATE (NINFER_ATTN_FUSE=on): attention's output gate applied to the
        # merged row as _sigmoid_gate_mul_kernel does it (the row rounded to out's dtype first, then
        # x / (1 + exp(-gate)) in fp32, rounded once), gate read in place through its token and head strides.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
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
        out = out.to(out_ptr.dtype.element_ty)
        if HAS_GATE:
            gate = tl.load(
                gate_ptr + row * gate_stride_b + head * gate_stride_h + offs_d, mask=d_mask, other=0.0
            )
            out = (out.to(tl.float32) / (1.0 + tl.exp(-gate.to(tl.float32)))).to(out_ptr.dtype.element_ty)
        tl.store(out_ptr + row * out_stride_b + head * out_stride_h + offs_d, out, mask=d_mask)


def paged_attention_decode(
    query: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    page_table: torch.Tensor,
    seq_lens: torch.Tensor,
    scale: float,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
    gate: torch.Tensor | None = None,
    *,
    fused: bool | None = None,
    max_splits: int | None = None,
    split_unit: int | None = None,
    block_n: int | None = None,
    num_warps: int = 4,
    int8_f16: bool | None = None,
    int8_grouped: bool | None = None,
    int8_keys_major: bool | None = None,
    num_stages: int | None = None,
    maxnreg: int | None = None,
) -> torch.Tensor:
    """Launcher for ``paged_attention_decode_ref`` (same contract; split-K "flash decoding"), float or
    int8 KV (int8: pass the scales; tiles are dequantised in registers).

    Batch invariance: sequence ``b``'s keys are cut into splits of ``decode_split_tokens(seq_lens[b],
    split_unit, max_splits)`` keys, a function of its own length only, and the reduce kernel merges its
    splits over a constant ``BLOCK_S = next_pow2(max_splits)`` (one fixed reduction tree). Nothing a
    sequence's output goes through depends on the batch size, on the other rows (CUDA-graph padding
    rows included) or on the page table's width, so it is bitwise the same alone or batched.

    The split rule, and its trade-off: a split is the fewest whole ``split_unit``s (default one tile,
    ``decode_block_n``: 32 keys at head_dim 256) that keep a sequence at ``max_splits`` (64; NEW_DEFAULTS) splits or
    fewer. Short sequences get one-tile splits, for parallelism where it is scarce: batch 1, 4 KV heads,
    1k keys = 32 splits = 128 programs; with 128 splits (NEW_DEFAULTS) 4k keys and longer = 512 programs (~4 per SM on 132
    SMs, what a memory-bound kernel needs in flight to fill the H200's bandwidth; 64 splits left the long
    contexts at ~2 programs a SM, and on the H200 128 beat 64 by 10% at batch 1, 8k keys, bf16). Long
    sequences get longer splits, never more of them: 100k keys = 128 splits of 800, 128k = 128 of 1024, so
    BLOCK_S and the partial buffers ([B, Hq, <= 128, D] fp32, 3 MiB a row at 24 x 256) stay bounded whatever
    the capacity. The cost: a large batch does not trade splits for rows (batch invariance forbids a
    batch-dependent count), so at B=8, 8k keys it runs 4096 programs of 64 keys and moves ~18% extra bytes
    as partials (mostly in L2; measured on the H200 at B=8, 8k: bf16 as fast as 64 splits, int8 4% slower);
    at 100k keys the partials are ~1.5% of bf16 KV, ~3% of int8. One fixed split length could not serve
    both ends (1k keys need splits of 32 for 128 programs; 128k keys would then be 4096 splits), hence a
    split length that grows with the sequence's own length.

    Tuning knobs, each a constant across a deployment (varying one per call would break the invariance):
    ``max_splits``, ``split_unit``, ``block_n`` (keys per tile, default ``decode_block_n``), ``num_warps`` and
    ``int8_f16`` (int8 KV with 16-bit queries: dequantise in fp16 without the conversion unit and run fp16
    dots, in NEW_DEFAULTS; False, the default for now: the fp32 dequantisation of the prefill kernel, I2F conversions at a quarter of
    the issue rate) and ``int8_grouped`` (int8 KV, head_dim <= 256: decode_int8.py's kernel, one fp16 dot per
    64-value scale group on the raw codes with the scales applied to the dots' results, no dequantised tile;
    it overrides ``int8_f16``; the default for 16-bit queries, with 64-key tiles and 128 splits unless given),
    ``int8_keys_major`` (with ``int8_grouped``: its keys-major build, decode_int8.py's
    ``_paged_attention_decode_int8_km_kernel``, launched with ``INT8_KEYS_MAJOR_LAUNCH`` unless ``num_stages`` /
    ``maxnreg`` say otherwise; None: ``NINFER_INT8_ATTENTION``), ``num_stages`` and ``maxnreg`` (Triton's
    pipeline depth and register cap, 0 for none; None: Triton's defaults, or the keys-major build's).
    bench/kernels/decode_attention.py sweeps them on the GPU.

    ``gate`` (attention's output gate, a strided view of the projection output): the result is gated as
    ``sigmoid_gate_mul`` gates it; when fused (``fused``, default ``NINFER_ATTN_FUSE``) in the reduce kernel's
    epilogue (no launch of its own, the same bits), else by ``sigmoid_gate_mul`` after it.

    The grid is sized from shapes only (``min(max_splits, cdiv(capacity, split_unit))`` splits), so the
    launch needs no host sync and can be captured in a CUDA graph; programs past a sequence's last
    split exit at once.
    """
    if not use_triton(query, key_cache, value_cache, page_table, seq_lens, key_scale, value_scale):
        return paged_attention_decode_ref(
            query, key_cache, value_cache, page_table, seq_lens, scale, key_scale, value_scale, gate
        )
    batch, num_q_heads, head_dim = query.shape
    num_pages, page_size, num_kv_heads = key_cache.shape[:3]
    assert key_cache.shape[3] == head_dim and num_q_heads % num_kv_heads == 0, (
        f"query {tuple(query.shape)} vs cache {tuple(key_cache.shape)}"
    )
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.stride(3) == 1 and query.stride(2) == 1
    assert page_table.shape[0] == batch and seq_lens.shape == (batch,) and page_table.stride(1) == 1
    assert gate is None or (gate.shape == query.shape and gate.stride(2) == 1), (
        f"gate {None if gate is None else tuple(gate.shape)} for query {tuple(query.shape)}"
    )
    num_scales = _int8_scales(key_cache, key_scale, value_scale)
    kv_int8 = key_scale is not None
    if int8_grouped is None:  # int8 KV with 16-bit queries: the grouped kernel (H200, 2026-12-04, 100k keys)
        int8_grouped = query.dtype in (torch.bfloat16, torch.float16) and num_scales <= 4
    int8_grouped = kv_int8 and int8_grouped
    if int8_grouped:  # its measured tiles: 64 keys, 128 splits (INT8_GROUPED_DEFAULTS)
        block_n = INT8_GROUPED_DEFAULTS["block_n"] if block_n is None else block_n
        max_splits = INT8_GROUPED_DEFAULTS["max_splits"] if max_splits is None else max_splits
    max_splits = DECODE_MAX_SPLITS if max_splits is None else max_splits
    block_n = decode_block_n(head_dim, kv_int8) if block_n is None else block_n
    split_unit = block_n if split_unit is None else split_unit
    assert split_unit % block_n == 0 and max_splits >= 1, f"split_unit={split_unit}, max_splits={max_splits}"
    if int8_f16 is None:
        int8_f16 = False  # NEW_DEFAULTS: query.dtype in (torch.bfloat16, torch.float16), once measured
    int8_f16 = kv_int8 and int8_f16
    assert not int8_grouped or num_scales <= 4, f"int8_grouped: head_dim {head_dim} over 4 scale groups"
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
    grid = (batch, num_kv_heads, part_splits)
    args = (
        query, key_cache, value_cache, scale_args[0], scale_args[1], page_table, seq_lens, part_out, part_lse,
        query.stride(0), query.stride(1), key_cache.stride(0), key_cache.stride(1), key_cache.stride(2),
        *scale_args[2:], page_table.stride(0), part_splits, scale * 1.4426950408889634,
    )  # fmt: skip
    shared = dict(
        NUM_Q_HEADS=num_q_heads, GROUP=group, HEAD_DIM=head_dim, PAGE_SIZE=page_size, NUM_SCALES=num_scales,
        SPLIT_UNIT=split_unit, MAX_SPLITS=max_splits, BLOCK_G=max(16, triton.next_power_of_2(group)),
        BLOCK_N=block_n, num_warps=num_warps,
    )  # fmt: skip
    if int8_keys_major is None:
        int8_keys_major = _dispatch.INT8_ATTENTION == "keys_major"
    launch = INT8_KEYS_MAJOR_LAUNCH if int8_grouped and int8_keys_major else {}
    num_stages = launch.get("num_stages") if num_stages is None else num_stages
    maxnreg = launch.get("maxnreg") if maxnreg is None else maxnreg
    if num_stages is not None:
        shared["num_stages"] = num_stages
    if maxnreg and not INTERPRET:  # (0: no cap, ptxas's own count)
        shared["maxnreg"] = maxnreg
    if int8_grouped:
        int8_shared = dict(
            BLOCK_DG=max(16, triton.next_power_of_2(head_dim // num_scales)),
            BLOCK_SCALES=triton.next_power_of_2(num_scales), ASM=not INTERPRET,
        )  # fmt: skip
        if int8_keys_major:  # the query heads are the MMAs' N: 8 is a whole MMA column block
            shared["BLOCK_G"] = max(8, triton.next_power_of_2(group))
            _paged_attention_decode_int8_km_kernel[grid](
                *args, **shared, **int8_shared, **pdl_args(query.device)
            )
        else:
            _paged_attention_decode_int8_kernel[grid](
                *args, **shared, **int8_shared, **pdl_args(query.device)
            )
    else:
        _paged_attention_decode_kernel[grid](
            *args, **shared, KV_INT8=kv_int8, INT8_F16=int8_f16, BLOCK_SCALES=triton.next_power_of_2(num_scales),
            BLOCK_D=block_d, **pdl_args(query.device),
        )  # fmt: skip
    reduce_block_d = min(64, block_d)
    fuse_gate = gate is not None and attn_fuse_enabled(fused)
    gate_args = (gate, gate.stride(0), gate.stride(1)) if gate is not None and fuse_gate else (out, 0, 0)
    _paged_attention_reduce_kernel[(batch, num_q_heads, triton.cdiv(head_dim, reduce_block_d))](
        part_out, part_lse, seq_lens, gate_args[0], out, gate_args[1], gate_args[2], out.stride(0), out.stride(1),
        part_splits, NUM_Q_HEADS=num_q_heads, HEAD_DIM=head_dim, SPLIT_UNIT=split_unit, MAX_SPLITS=max_splits,
        BLOCK_S=triton.next_power_of_2(max_splits), BLOCK_D=reduce_block_d, HAS_GATE=fuse_gate,
        **pdl_args(query.device),
    )  # fmt: skip
    return sigmoid_gate_mul(out, gate) if gate is not None and not fuse_gate else out
