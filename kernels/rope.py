"""Rotary position embedding references: partial RoPE with interleaved multimodal sections (mrope).

Qwen3.5 rotates only the first ``rotary_dim = head_dim * partial_rotary_factor`` channels of each
query/key head, in the "rotate half" layout (channel ``i`` pairs with ``i + rotary_dim / 2``), and
leaves the rest unchanged.

Positions are either ``[T]`` (text only) or ``[3, T]`` (temporal, height, width: vision tokens).
The frequency slots are assigned to the three axes *interleaved*: slot ``j`` (of ``rotary_dim / 2``)
takes the height position when ``j % 3 == 1 and j < 3 * sections[1]``, the width position when
``j % 3 == 2 and j < 3 * sections[2]``, and the temporal position otherwise. For text-only
positions all three rows are equal, so the result is plain 1-D partial RoPE (HF expands text
positions to three identical rows; checked by ``tests/kernels/test_rope.py``).

The model builds the cos/sin tables once per step (``rope_cos_sin_ref``'s math), so the mrope sections
live in the tables; ``apply_rope_qk`` (Triton) rotates query and key in place from them in one launch.
"""

from __future__ import annotations

import torch

from kernels._dispatch import HAS_TRITON, use_triton
from kernels.pdl import pdl_args

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait


def rope_inv_freq_ref(rotary_dim: int, theta: float, device: torch.device | None = None) -> torch.Tensor:
    """Inverse frequencies ``theta ** (-2j / rotary_dim)``, j = 0 .. rotary_dim/2 - 1 -> [rotary_dim / 2] fp32."""
    exponents = torch.arange(0, rotary_dim, 2, dtype=torch.int64).to(torch.float32) / rotary_dim
    return (1.0 / (theta**exponents)).to(device)


def mrope_axis_map_ref(num_freqs: int, mrope_section: tuple[int, ...] | None) -> torch.Tensor:
    """Which position axis (0 = T, 1 = H, 2 = W) drives each frequency slot -> [num_freqs] int64."""
    axis = torch.zeros(num_freqs, dtype=torch.int64)
    if mrope_section is None:
        return axis
    for dim in (1, 2):
        limit = min(3 * mrope_section[dim], num_freqs)
        axis[dim:limit:3] = dim
    return axis


def rope_cos_sin_ref(
    positions: torch.Tensor,
    rotary_dim: int,
    theta: float,
    mrope_section: tuple[int, ...] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables for the given positions.

    positions: [T] or [3, T] int -> (cos, sin), each [T, rotary_dim] fp32, with the half-table
    repeated twice (rotate-half layout).
    """
    inv_freq = rope_inv_freq_ref(rotary_dim, theta, positions.device)
    pos3 = positions.unsqueeze(0).expand(3, -1) if positions.dim() == 1 else positions
    freqs = pos3.to(torch.float32).unsqueeze(-1) * inv_freq  # [3, T, rotary_dim / 2]
    axis = mrope_axis_map_ref(inv_freq.numel(), mrope_section).to(positions.device)
    chosen = freqs.gather(0, axis.view(1, 1, -1).expand(1, freqs.shape[1], -1)).squeeze(0)
    table = torch.cat([chosen, chosen], dim=-1)
    return table.cos(), table.sin()


def apply_rope_ref(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the first ``rotary_dim`` channels of every head.

    x: [T, H, D], cos/sin: [T, rotary_dim] -> [T, H, D] (dtype of x). Channels >= rotary_dim pass through.
    """
    rotary_dim = cos.shape[-1]
    half = rotary_dim // 2
    xf = x.float()
    rot, rest = xf[..., :rotary_dim], xf[..., rotary_dim:]
    rotated_half = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    c, s = cos.unsqueeze(1).float(), sin.unsqueeze(1).float()
    return torch.cat([rot * c + rotated_half * s, rest], dim=-1).to(x.dtype)


def apply_rope_qk_ref(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """``apply_rope_ref`` on query and key, written back in place; returns (query, key).

    query: [T, Hq, D], key: [T, Hk, D], cos/sin: [T, rotary_dim] -> the same two tensors, rotated.
    """
    query.copy_(apply_rope_ref(query, cos, sin))
    key.copy_(apply_rope_ref(key, cos, sin))
    return query, key


if HAS_TRITON:

    @triton.jit
    def _rope_rotate_heads(
        x_ptr, rows, row_ok, stride_t, stride_h, num_heads, c1, c2, s1, s2, j, j_ok,
        HALF: tl.constexpr, BLOCK_H: tl.constexpr,
    ):  # fmt: skip
        # Rotates channels [0, 2 * HALF) of BLOCK_H heads x the given rows in place (rotate-half pairs
        # j, j + HALF), fp32 math; cos/sin halves are [BLOCK_T, BLOCK_HALF], broadcast over heads.
        h = tl.arange(0, BLOCK_H)
        mask = row_ok[:, None, None] & (h < num_heads)[None, :, None] & j_ok[None, None, :]
        ptrs = (
            x_ptr
            + rows.to(tl.int64)[:, None, None] * stride_t
            + h[None, :, None] * stride_h
            + j[None, None, :]
        )
        x1 = tl.load(ptrs, mask=mask, other=0.0).to(tl.float32)
        x2 = tl.load(ptrs + HALF, mask=mask, other=0.0).to(tl.float32)
        o1 = x1 * c1[:, None, :] - x2 * s1[:, None, :]
        o2 = x2 * c2[:, None, :] + x1 * s2[:, None, :]
        tl.store(ptrs, o1.to(x_ptr.dtype.element_ty), mask=mask)
        tl.store(ptrs + HALF, o2.to(x_ptr.dtype.element_ty), mask=mask)

    @triton.jit
    def _apply_rope_qk_kernel(
        q_ptr,
        k_ptr,
        cos_ptr,
        sin_ptr,
        num_tokens,
        num_q_heads,
        num_k_heads,
        q_stride_t,
        q_stride_h,
        k_stride_t,
        k_stride_h,
        cos_stride,
        sin_stride,
        HALF: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_HQ: tl.constexpr,
        BLOCK_HK: tl.constexpr,
        BLOCK_HALF: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (cdiv(T, BLOCK_T),): one program loads the cos/sin rows of BLOCK_T tokens once and
        # rotates every query head and every key head of those tokens in place (only the rotary
        # channels are read and written; the pass-through channels are never touched).
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        rows = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        row_ok = rows < num_tokens
        j = tl.arange(0, BLOCK_HALF)
        j_ok = j < HALF
        cs_mask = row_ok[:, None] & j_ok[None, :]
        cos_ptrs = cos_ptr + rows.to(tl.int64)[:, None] * cos_stride + j[None, :]
        sin_ptrs = sin_ptr + rows.to(tl.int64)[:, None] * sin_stride + j[None, :]
        c1 = tl.load(cos_ptrs, mask=cs_mask, other=0.0).to(tl.float32)
        c2 = tl.load(cos_ptrs + HALF, mask=cs_mask, other=0.0).to(tl.float32)
        s1 = tl.load(sin_ptrs, mask=cs_mask, other=0.0).to(tl.float32)
        s2 = tl.load(sin_ptrs + HALF, mask=cs_mask, other=0.0).to(tl.float32)
        _rope_rotate_heads(
            q_ptr, rows, row_ok, q_stride_t, q_stride_h, num_q_heads, c1, c2, s1, s2, j, j_ok, HALF, BLOCK_HQ
        )
        _rope_rotate_heads(
            k_ptr, rows, row_ok, k_stride_t, k_stride_h, num_k_heads, c1, c2, s1, s2, j, j_ok, HALF, BLOCK_HK
        )


# Elements per rotary half per program for the query tile: BLOCK_T = this // (BLOCK_HQ * BLOCK_HALF),
# 2 tokens x 32 heads x 32 at the 27B shape (3,840 programs at T = 7,680; 64 registers with 4 warps).
_ROPE_TILE = 2048
_ROPE_MAX_BLOCK_T = 16


def apply_rope_qk(
    query: torch.Tensor, key: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher for ``apply_rope_qk_ref`` (same contract: rotates query and key in place, one launch).

    query/key may be strided views (unit stride along D); no allocation, no host sync (CUDA-graph safe).
    """
    if not use_triton(query, key, cos, sin):
        return apply_rope_qk_ref(query, key, cos, sin)
    num_tokens, num_q_heads, head_dim = query.shape
    rotary_dim = cos.shape[-1]
    assert key.dim() == 3 and key.shape[0] == num_tokens and key.shape[2] == head_dim, (
        f"query {tuple(query.shape)}, key {tuple(key.shape)}"
    )
    assert query.dtype == key.dtype, f"query {query.dtype} != key {key.dtype}"
    assert cos.shape == sin.shape == (num_tokens, rotary_dim), (
        f"cos {tuple(cos.shape)}, sin {tuple(sin.shape)}"
    )
    assert rotary_dim % 2 == 0 and 0 < rotary_dim <= head_dim, f"rotary_dim={rotary_dim}, head_dim={head_dim}"
    for name, t in (("query", query), ("key", key), ("cos", cos), ("sin", sin)):
        assert t.stride(-1) == 1, f"{name} must have unit stride along its last dim"
    half = rotary_dim // 2
    block_half = triton.next_power_of_2(half)
    block_hq = triton.next_power_of_2(num_q_heads)
    block_t = max(1, min(_ROPE_MAX_BLOCK_T, _ROPE_TILE // (block_hq * block_half)))
    if num_tokens:
        _apply_rope_qk_kernel[(triton.cdiv(num_tokens, block_t),)](
            query, key, cos, sin, num_tokens, num_q_heads, key.shape[1],
            query.stride(0), query.stride(1), key.stride(0), key.stride(1), cos.stride(0), sin.stride(0),
            HALF=half, BLOCK_T=block_t, BLOCK_HQ=block_hq, BLOCK_HK=triton.next_power_of_2(key.shape[1]),
            BLOCK_HALF=block_half, num_warps=4, **pdl_args(query.device),
        )  # fmt: skip
    return query, key
