"""The DFlash draft model (engine/spec/dflash.py) against a loop-style reference written from the published
design (the companion's config and the DFlash reference forward): per query and head, the block's query
attends to the projected target features of every earlier position and to the whole block (non-causal),
a sliding layer only within its window; plain RMSNorm, rotate-half RoPE, SwiGLU. Float32 on the CPU.

The engine's form differs from the reference on purpose: the context K/V is computed per position as the
target computes it (here in two chunks, as catch-up does) and read back through a padded batch of rows of
different lengths; the reference computes everything at once for one sequence.
"""

from __future__ import annotations

import math

import pytest
import torch

from engine.spec.dflash import (
    FULL,
    PUBLISHED_35B_A3B,
    SLIDING,
    DFlashConfig,
    build_dflash,
    expected_shapes,
    random_dflash,
)

TINY = DFlashConfig(
    hidden_size=32,
    intermediate_size=48,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=8,
    layer_types=(SLIDING, FULL, SLIDING),
    sliding_window=6,
    block_size=8,
    mask_token_id=5,
    target_layer_ids=(0, 2, 3),
    rope_theta=10_000.0,
)


def _norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return w * (x / math.sqrt(float((x * x).mean()) + eps))


def _rope(x: torch.Tensor, pos: int, theta: float) -> torch.Tensor:
    """One head vector [D] at position pos: pairs (j, j + D/2) rotated by pos * theta^(-2j/D)."""
    d = x.shape[0]
    out = x.clone()
    for j in range(d // 2):
        angle = pos * theta ** (-2 * j / d)
        c, s = math.cos(angle), math.sin(angle)
        out[j] = x[j] * c - x[j + d // 2] * s
        out[j + d // 2] = x[j + d // 2] * c + x[j] * s
    return out


def reference(
    w: dict[str, torch.Tensor], c: DFlashConfig, features: torch.Tensor, embeds: torch.Tensor
) -> torch.Tensor:
    """One sequence: features [e, n*H] of positions 0..e-1, block embeddings [S, H] at e..e+S-1 -> [S, H]."""
    e, s, d = features.shape[0], embeds.shape[0], c.head_dim
    ctx = torch.stack([_norm(w["fc.weight"] @ f, w["hidden_norm.weight"], c.rms_norm_eps) for f in features])
    hidden = embeds.clone()
    key_pos = list(range(e + s))
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}."
        x = torch.stack([_norm(h, w[p + "input_layernorm.weight"], c.rms_norm_eps) for h in hidden])
        sources = torch.cat([ctx, x])  # context rows then block rows, positions 0 .. e + s - 1
        keys, values = [], []
        for pos, row in zip(key_pos, sources, strict=True):
            k = (w[p + "self_attn.k_proj.weight"] @ row).view(c.num_key_value_heads, d)
            v = (w[p + "self_attn.v_proj.weight"] @ row).view(c.num_key_value_heads, d)
            keys.append(
                [
                    _rope(_norm(kh, w[p + "self_attn.k_norm.weight"], c.rms_norm_eps), pos, c.rope_theta)
                    for kh in k
                ]
            )
            values.append(v)
        attn_out = torch.zeros(s, c.num_attention_heads * d)
        for qi in range(s):
            q_pos = e + qi
            q = (w[p + "self_attn.q_proj.weight"] @ x[qi]).view(c.num_attention_heads, d)
            for h in range(c.num_attention_heads):
                kv = h // (c.num_attention_heads // c.num_key_value_heads)
                qh = _rope(_norm(q[h], w[p + "self_attn.q_norm.weight"], c.rms_norm_eps), q_pos, c.rope_theta)
                seen = [j for j in key_pos if c.layer_types[i] == FULL or abs(q_pos - j) < c.sliding_window]
                scores = torch.tensor([float(qh @ keys[j][kv]) / math.sqrt(d) for j in seen])
                probs = torch.softmax(scores, dim=0)
                attn_out[qi, h * d : (h + 1) * d] = sum(
                    pr * values[j][kv] for pr, j in zip(probs, seen, strict=True)
                )
        hidden = hidden + attn_out @ w[p + "self_attn.o_proj.weight"].T
        for qi in range(s):
            y = _norm(hidden[qi], w[p + "post_attention_layernorm.weight"], c.rms_norm_eps)
            gate, up = w[p + "mlp.gate_proj.weight"] @ y, w[p + "mlp.up_proj.weight"] @ y
            hidden[qi] = hidden[qi] + w[p + "mlp.down_proj.weight"] @ (torch.nn.functional.silu(gate) * up)
    return torch.stack([_norm(h, w["norm.weight"], c.rms_norm_eps) for h in hidden])


def _weights(c: DFlashConfig, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_shapes(c).items():
        if len(shape) == 1:
            out[name] = 1.0 + 0.2 * torch.randn(shape, generator=gen)  # non-trivial plain norm weights
        else:
            out[name] = torch.randn(shape, generator=gen) / math.sqrt(shape[1])
    return out


def test_published_geometry_has_the_published_tensor_and_parameter_counts():
    shapes = expected_shapes(PUBLISHED_35B_A3B)
    assert len(shapes) == 69
    assert sum(math.prod(s) for s in shapes.values()) == 385_906_176
    assert shapes["fc.weight"] == (2048, 16384)
    assert PUBLISHED_35B_A3B.layer_types.count(SLIDING) == 5 and PUBLISHED_35B_A3B.max_draft_tokens == 15


def test_config_round_trips_through_its_hf_form():
    assert DFlashConfig.from_hf(TINY.to_hf()) == TINY
    hf = TINY.to_hf()
    del hf["layer_types"]  # absent: sliding layers then the full one
    assert DFlashConfig.from_hf(hf).layer_types == (SLIDING, SLIDING, FULL)


def test_build_refuses_missing_and_misshapen_tensors():
    w = _weights(TINY, 0)
    w["fc.weight"] = torch.zeros(3, 3)
    del w["norm.weight"]
    with pytest.raises(ValueError, match=r"missing norm.weight.*fc.weight: shape \(3, 3\)"):
        build_dflash(TINY, w)


@pytest.mark.parametrize("block", [2, 5, 8])
def test_block_forward_matches_the_loop_reference(block):
    """Two sequences (context 3 and 11 positions: inside and past the window), context KV written in two
    chunks, read through the padded batch: every block row equals the reference within float32 tolerance."""
    torch.manual_seed(0)
    w = _weights(TINY, 1)
    model = build_dflash(TINY, dict(w))
    n_feat = len(TINY.target_layer_ids) * TINY.hidden_size
    lengths = [3, 11]
    feats = [torch.randn(e, n_feat) for e in lengths]
    embeds = [torch.randn(block, TINY.hidden_size) for _ in lengths]
    # context K/V per layer, per sequence, computed as catch-up does (two chunks)
    ctx: list[list[tuple[torch.Tensor, torch.Tensor]]] = []
    for f, e in zip(feats, lengths, strict=True):
        cut = e // 2
        first = model.context_kv(f[:cut], torch.arange(cut))
        second = model.context_kv(f[cut:], torch.arange(cut, e))
        ctx.append(
            [(torch.cat([a[0], b[0]]), torch.cat([a[1], b[1]])) for a, b in zip(first, second, strict=True)]
        )
    width = max(lengths)

    def context(layer: int):
        keys = torch.zeros(2, width, TINY.num_key_value_heads, TINY.head_dim)
        values = torch.zeros_like(keys)
        for b, e in enumerate(lengths):
            keys[b, :e], values[b, :e] = ctx[b][layer]
            keys[b, e:] = 1e3  # padding: must be masked out
        pos = torch.arange(width).expand(2, -1)
        return keys, values, pos, pos < torch.tensor(lengths)[:, None]

    positions = torch.tensor(lengths)[:, None] + torch.arange(block)[None, :]
    got = model.forward_block(torch.stack(embeds), positions, context)
    for b in range(2):
        want = reference(w, TINY, feats[b], embeds[b])
        torch.testing.assert_close(got[b], want, rtol=1e-5, atol=1e-5)


def test_random_companion_is_finite_and_seeded():
    a = random_dflash(TINY, seed=3)
    b = random_dflash(TINY, seed=3)
    for (name, x), (_, y) in zip(a.state_dict().items(), b.state_dict().items(), strict=True):
        assert torch.equal(x, y), name
    assert all(torch.isfinite(t).all() for t in a.state_dict().values())


def test_pool_sizing_counts_the_drafter_kv_a_page_really_takes():
    """`--kv-capacity auto` / `--gpu-memory-limit` size the KV pool by `KVSpec.page_bytes`; under `--spec dflash`
    the drafter's context K/V grows with the pool too (`DFlashKV`, one slot per pool token), so its bytes a
    token, as engine/core.py adds them (`companion_bytes_per_token`), must be what `DFlashKV` allocates."""
    from dataclasses import replace

    from engine.cache.kv import KVSpec
    from engine.spec.dflash_draft import DFlashKV

    page_size, num_pages = 16, 5
    kv = DFlashKV(TINY, num_pages, page_size, torch.bfloat16, "cpu")
    allocated = sum(t.numel() * t.element_size() for t in (*kv.keys, *kv.values))
    per_token = DFlashKV.bytes_per_token(TINY, torch.bfloat16)
    assert allocated == (num_pages * page_size + 1) * per_token  # + the sink slot
    assert per_token == 2 * 3 * 2 * 8 * 2  # K and V, 3 layers, 2 heads of 8, bf16
    base = KVSpec(
        num_kv_layers=2, num_kv_heads=2, head_dim=8, num_gdn_layers=1, conv_shape=(4, 3),
        recurrent_shape=(2, 4, 4), dtype=torch.bfloat16,
    )  # fmt: skip
    with_drafter = replace(base, companion_bytes_per_token=per_token)
    assert with_drafter.page_bytes(page_size) == base.page_bytes(page_size) + page_size * per_token
