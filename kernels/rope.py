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
"""

from __future__ import annotations

import torch


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
