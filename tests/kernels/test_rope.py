"""Partial / interleaved-mrope RoPE references against a naive per-channel rotation and HF."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import Qwen3_5TextConfig
from transformers.models.qwen3_5.modeling_qwen3_5 import Qwen3_5TextRotaryEmbedding, apply_rotary_pos_emb

from kernels.rope import apply_rope_ref, mrope_axis_map_ref, rope_cos_sin_ref


def _naive_rope(x: torch.Tensor, pos_thw: list[tuple[int, int, int]], rotary_dim: int, theta: float,
                axis: list[int]) -> torch.Tensor:  # fmt: skip
    """Rotate channel pairs (j, j + rotary_dim/2) by angle pos[axis[j]] * theta^(-2j/rotary_dim)."""
    out = x.clone()
    half = rotary_dim // 2
    for t in range(x.shape[0]):
        for h in range(x.shape[1]):
            for j in range(half):
                angle = pos_thw[t][axis[j]] * theta ** (-2.0 * j / rotary_dim)
                a, b = x[t, h, j].item(), x[t, h, j + half].item()
                out[t, h, j] = a * math.cos(angle) - b * math.sin(angle)
                out[t, h, j + half] = b * math.cos(angle) + a * math.sin(angle)
    return out


@pytest.mark.parametrize(("head_dim", "rotary_dim"), [(40, 10), (60, 60), (256, 64)])
def test_text_positions_partial_rope_matches_naive(head_dim, rotary_dim, assert_close):
    x = torch.randn(63, 3, head_dim)
    positions = torch.randint(0, 5000, (63,))
    cos, sin = rope_cos_sin_ref(positions, rotary_dim, 1e7, (11, 11, 10) if rotary_dim == 64 else None)
    expected = _naive_rope(
        x, [(p, p, p) for p in positions.tolist()], rotary_dim, 1e7, [0] * (rotary_dim // 2)
    )
    # fp32 angles at positions up to 5000 carry ~pos * 6e-8 rad of rounding.
    assert_close("rope", apply_rope_ref(x, cos, sin), expected, ratio=1e-4)
    assert torch.equal(apply_rope_ref(x, cos, sin)[..., rotary_dim:], x[..., rotary_dim:])


def test_mrope_axes_are_interleaved():
    axis = mrope_axis_map_ref(32, (11, 11, 10)).tolist()
    assert axis[:6] == [0, 1, 2, 0, 1, 2]
    assert axis[30:] == [0, 1]  # 30 % 3 == 0 -> T; 31 % 3 == 1 and 31 < 3 * 11 -> H
    assert axis.count(1) == 11 and axis.count(2) == 10


def test_mrope_three_axis_positions_match_naive(assert_close):
    x = torch.randn(17, 2, 64)
    pos = torch.randint(0, 300, (3, 17))
    cos, sin = rope_cos_sin_ref(pos, 64, 1e4, (11, 11, 10))
    axis = mrope_axis_map_ref(32, (11, 11, 10)).tolist()
    expected = _naive_rope(x, list(zip(*pos.tolist(), strict=True)), 64, 1e4, axis)
    assert_close("mrope", apply_rope_ref(x, cos, sin), expected, ratio=1e-5)


def test_text_positions_match_hf_rotary_embedding(assert_close):
    config = Qwen3_5TextConfig(hidden_size=96, num_attention_heads=3, head_dim=64,
                               rope_parameters={"rope_type": "default", "rope_theta": 1e7,
                                                "partial_rotary_factor": 0.25, "mrope_section": [11, 11, 10]})  # fmt: skip
    hf_rope = Qwen3_5TextRotaryEmbedding(config)
    positions = torch.arange(5, 68)
    q, k = torch.randn(1, 3, 63, 64), torch.randn(1, 1, 63, 64)
    cos_hf, sin_hf = hf_rope(q, positions[None].expand(3, 1, -1))
    q_hf, k_hf = apply_rotary_pos_emb(q, k, cos_hf, sin_hf)
    cos, sin = rope_cos_sin_ref(positions, 16, 1e7, (11, 11, 10))
    assert_close("q", apply_rope_ref(q[0].transpose(0, 1), cos, sin), q_hf[0].transpose(0, 1), ratio=1e-6)
    assert_close("k", apply_rope_ref(k[0].transpose(0, 1), cos, sin), k_hf[0].transpose(0, 1), ratio=1e-6)
