"""Triton in-place RoPE on query and key vs its reference (GPU; or CPU under TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch

from kernels._dispatch import INTERPRET
from kernels.rope import apply_rope_qk, apply_rope_qk_ref, rope_cos_sin_ref

pytestmark = pytest.mark.gpu

# fp32 math on both sides; bf16 output one rounding apart at most (FMA contraction on the GPU).
# NOTE: Triton's interpreter truncates fp32 -> bf16 (the GPU rounds to nearest), hence its looser ratio.
RATIO = {torch.bfloat16: 1e-2 if INTERPRET else 4e-3, torch.float32: 1e-6}
ATOL = {torch.bfloat16: 1.6e-2, torch.float32: 1e-5}


def _check(query, key, cos, sin, assert_close):
    rotary_dim = cos.shape[-1]
    ref_q, ref_k = apply_rope_qk_ref(query.clone(), key.clone(), cos, sin)
    before_q, before_k = query.clone(), key.clone()
    out_q, out_k = apply_rope_qk(query, key, cos, sin)
    assert out_q is query and out_k is key, "rotates in place and returns its inputs"
    assert_close("query", query, ref_q, RATIO[query.dtype], ATOL[query.dtype])
    assert_close("key", key, ref_k, RATIO[key.dtype], ATOL[key.dtype])
    assert torch.equal(query[..., rotary_dim:], before_q[..., rotary_dim:]), "pass-through channels changed"
    assert torch.equal(key[..., rotary_dim:], before_k[..., rotary_dim:]), "pass-through channels changed"


@pytest.mark.parametrize(
    ("tokens", "q_heads", "k_heads", "head_dim", "rotary_dim"),
    [
        (1, 24, 4, 256, 64),  # 27B decode
        (37, 24, 4, 256, 64),
        (37, 6, 1, 40, 16),
        (5, 5, 3, 30, 10),  # non-power-of-two heads and rotary half
        (63, 4, 2, 64, 64),  # full rotary
        (300, 4, 2, 32, 8),  # tiny-model geometry
    ],
)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_matches_reference(tokens, q_heads, k_heads, head_dim, rotary_dim, dtype, device, assert_close):
    query = torch.randn(tokens, q_heads, head_dim, device=device, dtype=dtype)
    key = torch.randn(tokens, k_heads, head_dim, device=device, dtype=dtype)
    positions = torch.randint(0, 9000, (tokens,), device=device)
    cos, sin = rope_cos_sin_ref(positions, rotary_dim, 1e7)
    _check(query, key, cos, sin, assert_close)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_strided_query_and_mrope_positions(dtype, device, assert_close):
    """The attention layer's query is a [T, H, D] view of the q|gate projection (head stride 2D); vision
    tokens bring [3, T] positions (interleaved mrope sections)."""
    tokens, heads, head_dim = 29, 6, 64
    query = torch.randn(tokens, heads, 2 * head_dim, device=device, dtype=dtype)[..., :head_dim]
    key = torch.randn(tokens, 2, head_dim, device=device, dtype=dtype)
    positions = torch.randint(0, 500, (3, tokens), device=device)
    cos, sin = rope_cos_sin_ref(positions, 32, 1e4, (6, 5, 5))
    _check(query, key, cos, sin, assert_close)


def test_rope_27b_prefill_geometry(device, assert_close):
    if device != "cuda":
        pytest.skip("real-geometry size: too slow for the interpreter")
    tokens = 7680
    query = torch.randn(tokens, 24, 256, device=device, dtype=torch.bfloat16)
    key = torch.randn(tokens, 4, 256, device=device, dtype=torch.bfloat16)
    cos, sin = rope_cos_sin_ref(torch.arange(tokens, device=device) + 90000, 64, 1e7, (11, 11, 10))
    _check(query, key, cos, sin, assert_close)
