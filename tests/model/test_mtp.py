"""The MTP head against a reference written here from the ``mtp.*`` weights alone.

HF transformers drops ``mtp.*`` on load, so the reference is derived from the checkpoint layout and
vLLM's ``Qwen3_5MultiTokenPredictor`` (the serving engines' definition of the module):
``fc(concat(pre_fc_norm_embedding(embed(token)), pre_fc_norm_hidden(hidden)))`` -> one pre-norm
full-attention decoder layer (gated attention with q/k norms and partial RoPE, then the dense MLP or
the MoE block of the base model) -> ``mtp.norm``; embedding and lm_head shared with the base model.
It is written with plain torch ops (dense causal SDPA, per-token expert loop), not our kernels.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from engine.model import allocate_model_cache
from engine.model.weights import expected_mtp_weights


def _rms(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * (1.0 + w)


def _rope(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """Rotate-half partial RoPE; x: [T, H, D]."""
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2).float() / rotary_dim)
    ang = torch.cat([positions.float()[:, None] * inv] * 2, dim=-1)[:, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], dim=-1)
    return torch.cat([rot * ang.cos() + rotated * ang.sin(), rest], dim=-1)


def _ffn(x: torch.Tensor, w: dict[str, torch.Tensor], p: str, c) -> torch.Tensor:
    def mlp(v, q):
        return (F.silu(v @ w[f"{q}.gate_proj.weight"].t()) * (v @ w[f"{q}.up_proj.weight"].t())) @ w[
            f"{q}.down_proj.weight"
        ].t()

    if not c.is_moe:
        return mlp(x, p)
    out = torch.sigmoid(x @ w[f"{p}.shared_expert_gate.weight"].t()) * mlp(x, f"{p}.shared_expert")
    probs = (x @ w[f"{p}.gate.weight"].t()).softmax(-1)
    gate_up, down = w[f"{p}.experts.gate_up_proj"], w[f"{p}.experts.down_proj"]
    inter = c.moe_intermediate_size
    for t in range(x.shape[0]):
        top = probs[t].topk(c.num_experts_per_tok)
        for weight, e in zip((top.values / top.values.sum()).tolist(), top.indices.tolist(), strict=True):
            h = F.silu(gate_up[e, :inter] @ x[t]) * (gate_up[e, inter:] @ x[t])
            out[t] += weight * (down[e] @ h)
    return out


def _reference(w: dict[str, torch.Tensor], embed: torch.Tensor, c, tokens, hidden, positions) -> torch.Tensor:
    eps, heads, kv_heads, d = c.rms_norm_eps, c.num_attention_heads, c.num_key_value_heads, c.head_dim
    x = torch.cat([_rms(embed[tokens], w["mtp.pre_fc_norm_embedding.weight"], eps),
                   _rms(hidden, w["mtp.pre_fc_norm_hidden.weight"], eps)], dim=-1) @ w["mtp.fc.weight"].t()  # fmt: skip
    p = "mtp.layers.0"
    a = _rms(x, w[f"{p}.input_layernorm.weight"], eps)
    q, gate = (a @ w[f"{p}.self_attn.q_proj.weight"].t()).view(-1, heads, 2 * d).chunk(2, dim=-1)
    q = _rope(_rms(q, w[f"{p}.self_attn.q_norm.weight"], eps), positions, c.rotary_dim, c.rope_theta)
    k = (a @ w[f"{p}.self_attn.k_proj.weight"].t()).view(-1, kv_heads, d)
    k = _rope(_rms(k, w[f"{p}.self_attn.k_norm.weight"], eps), positions, c.rotary_dim, c.rope_theta)
    v = (a @ w[f"{p}.self_attn.v_proj.weight"].t()).view(-1, kv_heads, d)
    rep = heads // kv_heads
    o = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1).repeat_interleave(rep, 0),
                                       v.transpose(0, 1).repeat_interleave(rep, 0), is_causal=True)  # fmt: skip
    o = o.transpose(0, 1).reshape(len(tokens), -1) * torch.sigmoid(gate.reshape(len(tokens), -1))
    x = x + o @ w[f"{p}.self_attn.o_proj.weight"].t()
    x = x + _ffn(_rms(x, w[f"{p}.post_attention_layernorm.weight"], eps), w, f"{p}.mlp", c)
    return _rms(x, w["mtp.norm.weight"], eps)


def _mtp_weights(config, seed: int) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    out = {}
    for name, shape in expected_mtp_weights(config).items():
        scale = 0.3 if "norm" in name else 0.08
        out[name] = torch.randn(shape, generator=gen) * scale
    return out


@pytest.mark.parametrize("name", ["dense_a", "moe_b"])
def test_mtp_forward_matches_reference_and_uses_its_own_kv(tiny, paged, name):
    Driver, Lane = paged
    ckpt = tiny(name)
    mtp = _mtp_weights(ckpt.config, seed=11)
    model = ckpt.build(with_mtp=True, extra=mtp)
    c = ckpt.config
    gen = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, c.vocab_size, (23,), generator=gen)
    hidden = torch.randn(23, c.hidden_size, generator=gen)
    expected = _reference(mtp, ckpt.tensors["model.embed_tokens.weight"], c, tokens, hidden, torch.arange(23))

    cache = allocate_model_cache(
        c, num_pages=8, page_size=8, num_state_slots=1, dtype=torch.float32, with_mtp=True
    )
    assert len(cache.key_cache) == c.num_attention_layers + 1
    driver, lane = Driver(cache), Lane(slot=0)
    rows = [model.forward_mtp(driver.batch([lane], [tokens[:20].tolist()]), hidden[:20], cache)]
    for t in range(20, 23):  # continue one token at a time through the MTP layer's own pages
        rows.append(model.forward_mtp(driver.batch([lane], [[int(tokens[t])]]), hidden[t : t + 1], cache))
    got = torch.cat(rows)
    rel = ((got - expected).abs().max() / expected.abs().max()).item()
    assert rel < 1e-5, f"{name}: MTP max relative error {rel:.2e}"
    assert all(not k.any() for k in cache.key_cache[: c.num_attention_layers]), "MTP wrote base-model KV"
    assert cache.key_cache[-1].any()
    logits = model.compute_logits(got, torch.tensor([22]))
    assert logits.shape == (1, c.vocab_size)


def test_forward_mtp_without_mtp_weights_is_refused(tiny, paged):
    Driver, Lane = paged
    ckpt = tiny("dense_a")
    model = ckpt.build()
    cache = allocate_model_cache(
        ckpt.config, num_pages=2, page_size=8, num_state_slots=1, dtype=torch.float32
    )
    batch = Driver(cache).batch([Lane(slot=0)], [[1, 2]])
    with pytest.raises(RuntimeError, match="with_mtp=False"):
        model.forward_mtp(batch, torch.zeros(2, ckpt.config.hidden_size), cache)
