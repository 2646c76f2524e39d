"""``store_kv``: write new tokens' K/V into their page slots (int8 caches: quantised per group on the way)."""

from __future__ import annotations

import torch

from kernels._dispatch import HAS_TRITON, use_triton
from kernels.attention.int8 import _int8_scales, quantize_kv_int8_ref
from kernels.pdl import pdl_args

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.attention.int8 import _quantize_store_row
    from kernels.pdl import pdl_launch_dependents, pdl_wait


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


# ---------------------------------------------------------------------------------------------------
# Triton

if HAS_TRITON:

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
        PDL: tl.constexpr,
    ):
        # grid (T, Hkv): one program writes one token's key and value row for one KV head into its slot:
        # a copy (cast to the cache dtype), or with KV_INT8 int8 codes plus one fp16 scale per group.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
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
            BLOCK_D=triton.next_power_of_2(head_dim), **pdl_args(key.device),
        )  # fmt: skip
