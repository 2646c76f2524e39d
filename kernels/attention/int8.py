"""INT8 KV: one fp16 scale per group of ``KV_INT8_GROUP`` (64) values along head_dim (a head_dim under 64 is
one group); ``scale = absmax / 127``, ``code = round(x / scale)``. The torch references and the Triton helpers
every attention kernel shares: ``_quantize_store_row`` (store.py) and ``_dequantize_tile`` (decode.py,
prefill.py) run the same arithmetic in registers, bit for bit; ``_dequantize_tile_f16`` (decode.py's default for
16-bit queries) multiplies in fp16 instead, rounding each dequantised value once to fp16."""

from __future__ import annotations

import torch

from kernels._dispatch import HAS_TRITON

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


# ---------------------------------------------------------------------------------------------------
# Triton helpers (called from the kernels of store.py, decode.py and prefill.py)

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
    def _dequantize_tile_f16(
        codes,
        scale_ptr,
        scale_rows,
        t_mask,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_D: tl.constexpr,
    ):
        # _dequantize_tile in fp16, for the decode kernel's 16-bit dots: codes int8 [BLOCK_N, BLOCK_D] -> fp16
        # (exact: |code| <= 127), times the group's fp16 scale in fp16 (one rounding to fp16's 11 bits, finer
        # than bf16's 8). No fp32 tile: half the registers and conversions of the fp32 path, and no fp32 ->
        # 16-bit conversion before the dot. Columns map to groups as in _dequantize_tile.
        offs_s = tl.arange(0, BLOCK_SCALES)
        scales = tl.load(
            scale_ptr + scale_rows[:, None] + offs_s[None, :],
            mask=t_mask[:, None] & (offs_s < NUM_SCALES)[None, :],
            other=0.0,
        )
        # int8 -> fp16 without the conversion unit (I2F issues at a quarter of the integer and half-precision
        # rate): the code's byte b, zero-extended, XOR 0x6480 is 0x6400 | (c + 128) for c in [-128, 127] (bit 7
        # flips: c >= 0 gains 128, c < 0 loses it from b = 256 + c), the fp16 1024 + c + 128, exactly; minus
        # 1152 is c.
        biased = codes.to(tl.uint8, bitcast=True).to(tl.uint16) ^ 0x6480
        values = biased.to(tl.float16, bitcast=True) - 1152.0
        groups = tl.reshape(values, (BLOCK_N, BLOCK_SCALES, BLOCK_D // BLOCK_SCALES))
        return tl.reshape(groups * scales[:, :, None], (BLOCK_N, BLOCK_D))
