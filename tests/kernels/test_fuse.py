"""The references of NINFER_ATTN_FUSE's launches (CPU): ``qk_norm_rope_store_ref`` is the q/k norms, partial RoPE
and the K/V store in that order, skipping slot -1 rows; a decode with a gate is the decode, then the output gate.
Off CUDA the launchers run these references whatever the switch says."""

from __future__ import annotations

import pytest
import torch

from kernels.activation import sigmoid_gate_mul_ref
from kernels.attention import (
    paged_attention_decode,
    paged_attention_decode_ref,
    qk_norm_rope_store,
    qk_norm_rope_store_ref,
)
from kernels.norm import rms_norm_ref
from kernels.rope import apply_rope_ref, rope_cos_sin_ref


def _prologue_inputs(tokens: int, q_heads: int, kv_heads: int, head_dim: int, rotary_dim: int) -> dict:
    row = torch.randn(tokens, (q_heads + 2 * kv_heads) * head_dim).bfloat16()
    q_end, k_end = q_heads * head_dim, (q_heads + kv_heads) * head_dim
    cos, sin = rope_cos_sin_ref(torch.arange(100, 100 + tokens), rotary_dim, 1e7)
    return dict(
        query=row[:, :q_end].view(tokens, q_heads, head_dim),
        key=row[:, q_end:k_end].view(tokens, kv_heads, head_dim),
        value=row[:, k_end:].view(tokens, kv_heads, head_dim),
        q_weight=0.2 * torch.randn(head_dim),
        k_weight=0.2 * torch.randn(head_dim),
        eps=1e-6,
        cos=cos,
        sin=sin,
    )


@pytest.mark.parametrize("fused", [False, True])
def test_prologue_reference_normalises_rotates_and_stores(fused: bool) -> None:
    tokens, q_heads, kv_heads, head_dim, rotary_dim, page_size = 5, 3, 1, 16, 8, 4
    inputs = _prologue_inputs(tokens, q_heads, kv_heads, head_dim, rotary_dim)
    caches = [torch.zeros(3, page_size, kv_heads, head_dim, dtype=torch.bfloat16) for _ in "kv"]
    slots = torch.tensor([7, -1, 0, 11, -1])
    out = qk_norm_rope_store(
        **inputs, key_cache=caches[0], value_cache=caches[1], slot_mapping=slots, fused=fused
    )
    eps, cos, sin = inputs["eps"], inputs["cos"], inputs["sin"]
    assert torch.equal(out, apply_rope_ref(rms_norm_ref(inputs["query"], inputs["q_weight"], eps), cos, sin))
    key = apply_rope_ref(rms_norm_ref(inputs["key"], inputs["k_weight"], eps), cos, sin)
    flat_k, flat_v = (c.view(-1, kv_heads, head_dim) for c in caches)
    for token, slot in enumerate(slots.tolist()):
        if slot >= 0:
            assert torch.equal(flat_k[slot], key[token]) and torch.equal(flat_v[slot], inputs["value"][token])
    valid = slots[slots >= 0]
    others = torch.ones(flat_k.shape[0], dtype=torch.bool)
    others[valid] = False
    assert not flat_k[others].any() and not flat_v[others].any(), "slot -1 rows stored something"
    # pass-through channels are the normalised query, untouched by the rotation
    normed = rms_norm_ref(inputs["query"], inputs["q_weight"], eps)
    assert torch.equal(out[..., rotary_dim:], normed[..., rotary_dim:])
    assert not torch.equal(out[..., :rotary_dim], normed[..., :rotary_dim])
    again = [torch.zeros_like(c) for c in caches]
    ref = qk_norm_rope_store_ref(**inputs, key_cache=again[0], value_cache=again[1], slot_mapping=slots)
    assert torch.equal(ref, out) and all(torch.equal(a, b) for a, b in zip(again, caches, strict=True))


@pytest.mark.parametrize("fused", [False, True])
def test_decode_reference_with_a_gate_gates_the_decode(fused: bool) -> None:
    batch, q_heads, kv_heads, head_dim, page_size = 3, 4, 2, 16, 4
    key_cache, value_cache = (torch.randn(6, page_size, kv_heads, head_dim) for _ in "kv")
    page_table = torch.tensor([[0, 1], [2, 3], [4, 5]], dtype=torch.int32)
    lens = torch.tensor([5, 1, 8], dtype=torch.int32)
    query_gate = torch.randn(batch, q_heads, 2 * head_dim)
    query, gate = query_gate[..., :head_dim], query_gate[..., head_dim:]
    args = (query, key_cache, value_cache, page_table, lens, 0.25)
    plain = paged_attention_decode_ref(*args)
    assert torch.equal(
        paged_attention_decode(*args, gate=gate, fused=fused), sigmoid_gate_mul_ref(plain, gate)
    )
    assert torch.equal(paged_attention_decode(*args, fused=fused), plain)
