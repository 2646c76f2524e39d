"""``qk_norm_rope_store``: gated attention's work between its input projections and the attention kernel, one launch.

Unfused (today's default) it is four launches a layer: the per-head ``(1 + w)`` RMSNorm of the query
(``kernels.norm.rms_norm``), the same of the key, partial RoPE on both in place (``kernels.rope.apply_rope_qk``)
and the K/V store into the pages (``store_kv``). Under ``NINFER_ATTN_FUSE=on`` (``kernels._dispatch``) a float
(bf16 / fp32) cache takes ``_qk_norm_rope_store_kernel`` instead: one program normalises a block of (token, head)
rows of the query or of the key in registers, rotates their first ``rotary_dim`` channels, and writes the query to
a new [T, H, D] tensor or the key straight into its page slot (with that token's value row beside it); the
normalised key never goes through memory. Slot ``-1`` rows (CUDA-graph padding) store nothing.

Bitwise the unfused kernels: each value goes through the same fp32 operations in the same order and is rounded
where they round (the normalised value to the activation dtype before the rotation, as ``rms_norm`` writes it and
``apply_rope_qk`` reads it back; the rotated value to the activation dtype, then the cache dtype, as ``store_kv``
casts). The norm's row sum takes the same [BLOCK_ROWS, BLOCK_D] tile, warps and reduction as ``rms_norm``'s kernel.

Vision (mrope) positions need nothing here: the model builds its cos/sin tables with the mrope sections in them
(``kernels.rope``), and both paths read those tables. An int8 cache keeps the unfused path (its quantising store
reads the rotated key back from memory, ``store_kv``), as does a run on the torch references.
"""

from __future__ import annotations

import torch

from kernels import _dispatch
from kernels._dispatch import HAS_TRITON, use_triton
from kernels.attention.store import store_kv, store_kv_ref
from kernels.norm import rms_norm, rms_norm_ref
from kernels.pdl import pdl_args
from kernels.rope import apply_rope_qk, apply_rope_qk_ref

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait


def qk_norm_rope_store_ref(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
) -> torch.Tensor:
    """Per-head ``(1 + w)`` RMSNorm of query and key, partial RoPE on both, K/V stored into the pages.

    query: [T, H, D]; key, value: [T, Hkv, D] (any token/head strides, unit stride along D: views of the
    projections' output); q_weight, k_weight: [D] (offsets from one, ``rms_norm_ref``); cos, sin: [T, rotary_dim]
    (``rope_cos_sin_ref``); caches, slot_mapping and the int8 scales as ``store_kv_ref`` takes them (slot -1 =
    skip). Returns the normalised, rotated query [T, H, D] (new, contiguous, query.dtype); writes the caches.
    """
    normed_query = rms_norm_ref(query, q_weight, eps)
    normed_key = rms_norm_ref(key, k_weight, eps)
    apply_rope_qk_ref(normed_query, normed_key, cos, sin)
    store_kv_ref(normed_key, value, key_cache, value_cache, slot_mapping, key_scale, value_scale)
    return normed_query


def attn_fuse_enabled(fused: bool | None = None) -> bool:
    """Whether the fused attention launches run where the kernels run Triton: ``fused`` when given (tests, bench),
    else ``NINFER_ATTN_FUSE`` (``kernels._dispatch.ATTN_FUSE``)."""
    return _dispatch.ATTN_FUSE == "on" if fused is None else fused


# ---------------------------------------------------------------------------------------------------
# Triton

if HAS_TRITON:

    @triton.jit
    def _norm_rope_rows(
        x_ptr, x_rows, w_ptr, cos_ptr, sin_ptr, cos_rows, sin_rows, dst_ptr, dst_rows, row_ok, dim, eps,
        HALF: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HALF: tl.constexpr,
    ):  # fmt: skip
        # One [BLOCK_ROWS, BLOCK_D] tile of head rows (x_rows / dst_rows: each row's offset, int64): zero-centred
        # RMSNorm as _rms_norm_kernel computes it, rounded to x's dtype; channels >= 2 * HALF stored as they are,
        # channels j, j + HALF (j < HALF) rotated as _apply_rope_qk_kernel rotates them (from the rounded values,
        # reloaded from x and normalised again: the same per-element arithmetic), rounded to x's dtype and then
        # to dst's.
        cols = tl.arange(0, BLOCK_D)
        col_mask = cols < dim
        mask = row_ok[:, None] & col_mask[None, :]
        x = tl.load(x_ptr + x_rows[:, None] + cols[None, :], mask=mask, other=0.0)
        xf = x.to(tl.float32)
        inv_rms = tl.rsqrt(tl.sum(xf * xf, axis=1) / dim + eps)
        w = tl.load(w_ptr + cols, mask=col_mask, other=0.0).to(tl.float32)
        w = 1.0 + w
        y = (xf * inv_rms[:, None] * w[None, :]).to(x_ptr.dtype.element_ty)
        dst = dst_ptr + dst_rows[:, None]
        tl.store(dst + cols[None, :], y.to(dst_ptr.dtype.element_ty), mask=mask & (cols >= 2 * HALF)[None, :])
        j = tl.arange(0, BLOCK_HALF)
        j_ok = j < HALF
        rot_mask = row_ok[:, None] & j_ok[None, :]
        x1 = tl.load(x_ptr + x_rows[:, None] + j[None, :], mask=rot_mask, other=0.0).to(tl.float32)
        x2 = tl.load(x_ptr + x_rows[:, None] + HALF + j[None, :], mask=rot_mask, other=0.0).to(tl.float32)
        w1 = 1.0 + tl.load(w_ptr + j, mask=j_ok, other=0.0).to(tl.float32)
        w2 = 1.0 + tl.load(w_ptr + HALF + j, mask=j_ok, other=0.0).to(tl.float32)
        y1 = (x1 * inv_rms[:, None] * w1[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
        y2 = (x2 * inv_rms[:, None] * w2[None, :]).to(x_ptr.dtype.element_ty).to(tl.float32)
        cos_ptrs = cos_ptr + cos_rows[:, None] + j[None, :]
        sin_ptrs = sin_ptr + sin_rows[:, None] + j[None, :]
        c1 = tl.load(cos_ptrs, mask=rot_mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptrs + HALF, mask=rot_mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptrs, mask=rot_mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptrs + HALF, mask=rot_mask, other=0.0).to(tl.float32)
        o1 = y1 * c1 - y2 * s1
        o2 = y2 * c2 + y1 * s2
        o1 = o1.to(x_ptr.dtype.element_ty).to(dst_ptr.dtype.element_ty)
        o2 = o2.to(x_ptr.dtype.element_ty).to(dst_ptr.dtype.element_ty)
        tl.store(dst + j[None, :], o1, mask=rot_mask)
        tl.store(dst + HALF + j[None, :], o2, mask=rot_mask)

    @triton.jit
    def _qk_norm_rope_store_kernel(
        q_ptr, k_ptr, v_ptr, q_w_ptr, k_w_ptr, cos_ptr, sin_ptr, key_cache_ptr, value_cache_ptr, slot_mapping_ptr,
        q_out_ptr, num_tokens, num_q_heads, num_kv_heads, dim, q_programs,
        q_stride_t, q_stride_h, k_stride_t, k_stride_h, v_stride_t, v_stride_h, cos_stride, sin_stride,
        cache_stride_slot, cache_stride_head, eps,
        HALF: tl.constexpr, BLOCK_ROWS: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_HALF: tl.constexpr,
        PDL: tl.constexpr,
    ):  # fmt: skip
        # grid (q_programs + cdiv(T * Hkv, BLOCK_ROWS),): programs [0, q_programs) take BLOCK_ROWS query rows each
        # (row r = token r // H, head r % H) into q_out [T * H, D]; the rest take BLOCK_ROWS key rows each into their
        # slots of the key cache and copy the same rows of value into the value cache (slot -1: nothing stored).
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        pid = tl.program_id(0)
        offs = tl.arange(0, BLOCK_ROWS)
        if pid < q_programs:
            rows32 = pid * BLOCK_ROWS + offs
            tokens = (rows32 // num_q_heads).to(tl.int64)
            heads = (rows32 % num_q_heads).to(tl.int64)
            _norm_rope_rows(
                q_ptr, tokens * q_stride_t + heads * q_stride_h, q_w_ptr, cos_ptr, sin_ptr,
                tokens * cos_stride, tokens * sin_stride, q_out_ptr, rows32.to(tl.int64) * dim,
                rows32 < num_tokens * num_q_heads, dim, eps, HALF, BLOCK_D, BLOCK_HALF,
            )  # fmt: skip
        else:
            rows32 = (pid - q_programs) * BLOCK_ROWS + offs
            tokens = (rows32 // num_kv_heads).to(tl.int64)
            heads = (rows32 % num_kv_heads).to(tl.int64)
            in_range = rows32 < num_tokens * num_kv_heads
            slots = tl.load(slot_mapping_ptr + tokens, mask=in_range, other=-1).to(tl.int64)
            row_ok = in_range & (slots >= 0)
            dst_rows = slots * cache_stride_slot + heads * cache_stride_head
            _norm_rope_rows(
                k_ptr, tokens * k_stride_t + heads * k_stride_h, k_w_ptr, cos_ptr, sin_ptr,
                tokens * cos_stride, tokens * sin_stride, key_cache_ptr, dst_rows, row_ok, dim, eps,
                HALF, BLOCK_D, BLOCK_HALF,
            )  # fmt: skip
            cols = tl.arange(0, BLOCK_D)
            mask = row_ok[:, None] & (cols < dim)[None, :]
            v_rows = tokens * v_stride_t + heads * v_stride_h
            values = tl.load(v_ptr + v_rows[:, None] + cols[None, :], mask=mask)
            tl.store(
                value_cache_ptr + dst_rows[:, None] + cols[None, :],
                values.to(value_cache_ptr.dtype.element_ty),
                mask=mask,
            )


def qk_norm_rope_store(
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    q_weight: torch.Tensor,
    k_weight: torch.Tensor,
    eps: float,
    cos: torch.Tensor,
    sin: torch.Tensor,
    key_cache: torch.Tensor,
    value_cache: torch.Tensor,
    slot_mapping: torch.Tensor,
    key_scale: torch.Tensor | None = None,
    value_scale: torch.Tensor | None = None,
    *,
    fused: bool | None = None,
) -> torch.Tensor:
    """Launcher for ``qk_norm_rope_store_ref`` (same contract): one launch for a float cache when fused
    (``fused``, default ``NINFER_ATTN_FUSE``; bitwise the unfused launches), else the four unfused launches.

    No allocation but the query's output, no host sync (CUDA-graph safe); any number of tokens.
    """
    on_triton = use_triton(
        query, key, value, q_weight, k_weight, cos, sin, key_cache, value_cache, slot_mapping
    )
    if not on_triton or not attn_fuse_enabled(fused) or key_scale is not None:
        # NINFER_ATTN_FUSE=off, an int8 cache, or the references: the four launchers (Triton or their references)
        normed_query = rms_norm(query, q_weight, eps)
        normed_key = rms_norm(key, k_weight, eps)
        apply_rope_qk(normed_query, normed_key, cos, sin)  # in place: both are fresh norm outputs
        store_kv(normed_key, value, key_cache, value_cache, slot_mapping, key_scale, value_scale)
        return normed_query
    num_tokens, num_q_heads, head_dim = query.shape
    num_kv_heads = key.shape[1]
    rotary_dim = cos.shape[-1]
    assert key.shape == value.shape == (num_tokens, num_kv_heads, head_dim), (
        f"query {tuple(query.shape)}, key {tuple(key.shape)}, value {tuple(value.shape)}"
    )
    assert query.dtype == key.dtype, f"query {query.dtype} != key {key.dtype}"
    assert (
        q_weight.shape == k_weight.shape == (head_dim,)
        and q_weight.is_contiguous()
        and k_weight.is_contiguous()
    )
    assert cos.shape == sin.shape == (num_tokens, rotary_dim), (
        f"cos {tuple(cos.shape)}, sin {tuple(sin.shape)}"
    )
    assert rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim, f"rotary_dim={rotary_dim}, head_dim={head_dim}"
    assert key_cache.shape == value_cache.shape and key_cache.stride() == value_cache.stride()
    assert key_cache.shape[2:] == (num_kv_heads, head_dim), f"cache {tuple(key_cache.shape)}"
    assert key_cache.stride(0) == key_cache.shape[1] * key_cache.stride(1), "pages must tile the slot axis"
    assert key_cache.dtype.is_floating_point and slot_mapping.shape == (num_tokens,)
    for name, t in (("query", query), ("key", key), ("value", value), ("cos", cos), ("sin", sin)):
        assert t.stride(-1) == 1, f"{name} must have unit stride along its last dim"
    assert key_cache.stride(3) == 1
    out = torch.empty(query.shape, dtype=query.dtype, device=query.device)
    if num_tokens == 0:
        return out
    block_d = triton.next_power_of_2(head_dim)
    block_rows = max(1, min(16, 2048 // block_d))  # _launch_rms_norm's tile: the same row-sum reduction
    q_programs = triton.cdiv(num_tokens * num_q_heads, block_rows)
    grid = (q_programs + triton.cdiv(num_tokens * num_kv_heads, block_rows),)
    _qk_norm_rope_store_kernel[grid](
        query, key, value, q_weight, k_weight, cos, sin, key_cache, value_cache, slot_mapping, out,
        num_tokens, num_q_heads, num_kv_heads, head_dim, q_programs,
        query.stride(0), query.stride(1), key.stride(0), key.stride(1), value.stride(0), value.stride(1),
        cos.stride(0), sin.stride(0), key_cache.stride(1), key_cache.stride(2), eps,
        HALF=rotary_dim // 2, BLOCK_ROWS=block_rows, BLOCK_D=block_d,
        BLOCK_HALF=triton.next_power_of_2(rotary_dim // 2), num_warps=8 if block_d >= 4096 else 4,
        **pdl_args(query.device),
    )  # fmt: skip
    return out
