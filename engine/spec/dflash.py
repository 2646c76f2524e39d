"""The DFlash draft model (`--spec dflash`): a small block-diffusion transformer conditioned on target features.

Owns: the companion's geometry (`DFlashConfig`, read from its HF `config.json`) and its forward math
(`DFlashDraftModel`). Must not touch: pages, requests, the target model (it receives the target's embedding
rows and hands back hidden states the target's output head reads; engine/spec/dflash_draft.py drives it).

The published companion for Qwen3.6-35B-A3B (`z-lab/Qwen3.6-35B-A3B-DFlash`, rev f181eece): 6 dense Qwen3
blocks (hidden 2048, MLP 6144, 32 query / 8 KV heads of 128), 5 sliding-window layers (window 4096) and 1
full layer, all non-causal; block 16 = 1 anchor + 15 mask tokens (mask row 248077); target feature layers
[1, 6, 11, 16, 22, 27, 32, 37]; plain RMSNorm (`x * w`, not the target's `(1 + w)`); 69 tensors, 385,906,176
parameters. The checkpoint's names (module names here, so loading is name for name):

    fc.weight [H, n*H]  hidden_norm.weight [H]  norm.weight [H]
    layers.{i}.self_attn.{q,k,v,o}_proj.weight   layers.{i}.self_attn.{q,k}_norm.weight [head_dim]
    layers.{i}.mlp.{gate,up,down}_proj.weight    layers.{i}.{input,post_attention}_layernorm.weight

It has no embedding and no output head: both are the target's. Not stated by the published card and taken
here as the DFlash reference code does: RoPE is plain (non-interleaved, whole head) with the config's
`rope_theta` (default 10,000,000, the target family's); the full layer is the last one when `layer_types` is
absent; projections carry no bias.

The forward (the DFlash paper and reference code, arXiv 2602.06036):

    ctx_p   = hidden_norm(fc(concat_l target_layer_l_output_p))          one row per target position p
    K_ctx   = k_norm(k_proj(ctx_p)) roped at p;  V_ctx = v_proj(ctx_p)   per draft layer (the "context KV")
    block   = embed([anchor, mask, ..., mask]) at positions e .. e + k   (anchor: the last committed token)
    per layer: q, k, v of the block (q_norm / k_norm, RoPE); attention of the block's queries over
               [K_ctx of positions < e ; the block's own K], non-causal; a sliding layer sees only keys with
               |q_pos - k_pos| < window; then o_proj, residual, RMSNorm, SwiGLU MLP, residual
    out     = norm(hidden)  ->  the target's output head on block rows 1 .. k gives the k proposals

The context KV of position p depends only on the target's features at p, so it is computed once, when the
target computes p, and kept (engine/spec/dflash_draft.py stores it in pages beside the target's KV).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from kernels.linear import linear

SLIDING, FULL = "sliding_attention", "full_attention"

# Per layer: (keys [B, C, Hkv, D], values [B, C, Hkv, D], key positions [B, C], valid [B, C]) of the context.
ContextFor = Callable[[int], tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]


@dataclass(frozen=True)
class DFlashConfig:
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    layer_types: tuple[str, ...]
    sliding_window: int
    block_size: int  # 1 anchor + (block_size - 1) mask proposals, the trained width
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # target decoder layers whose outputs are the features
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10_000_000.0

    def __post_init__(self) -> None:
        if len(self.layer_types) != self.num_hidden_layers or set(self.layer_types) - {SLIDING, FULL}:
            raise ValueError(f"DFlash layer_types {self.layer_types}: one of {SLIDING!r}/{FULL!r} per layer")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("DFlash: query heads must be a multiple of KV heads")
        if not self.target_layer_ids:
            raise ValueError("DFlash: no target_layer_ids")

    @property
    def max_draft_tokens(self) -> int:
        return self.block_size - 1

    def window(self, layer: int) -> int | None:
        return self.sliding_window if self.layer_types[layer] == SLIDING else None

    @classmethod
    def from_hf(cls, hf: dict[str, Any]) -> DFlashConfig:
        """From the companion's HF `config.json` (its `dflash_config` block holds the DFlash fields)."""
        extra = hf.get("dflash_config") or {}

        def get(name: str, default: Any = None) -> Any:
            return extra.get(name, hf.get(name, default))

        layers = int(hf["num_hidden_layers"])
        types = hf.get("layer_types") or [SLIDING] * (layers - 1) + [FULL]
        rope = hf.get("rope_parameters") or {}
        target = get("target_layer_ids")
        if target is None:
            raise ValueError("DFlash config: no dflash_config.target_layer_ids")
        return cls(
            hidden_size=int(hf["hidden_size"]),
            intermediate_size=int(hf["intermediate_size"]),
            num_hidden_layers=layers,
            num_attention_heads=int(hf["num_attention_heads"]),
            num_key_value_heads=int(hf["num_key_value_heads"]),
            head_dim=int(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"]),
            layer_types=tuple(types),
            sliding_window=int(hf.get("sliding_window") or 4096),
            block_size=int(get("block_size", 16)),
            mask_token_id=int(get("mask_token_id")),
            target_layer_ids=tuple(int(i) for i in target),
            rms_norm_eps=float(hf.get("rms_norm_eps", 1e-6)),
            rope_theta=float(hf.get("rope_theta") or rope.get("rope_theta") or 10_000_000.0),
        )

    def to_hf(self) -> dict[str, Any]:
        """The HF-shaped `config.json` (what `from_hf` reads back)."""
        return {
            "architectures": ["DFlashDraftModel"],
            "hidden_size": self.hidden_size,
            "intermediate_size": self.intermediate_size,
            "num_hidden_layers": self.num_hidden_layers,
            "num_attention_heads": self.num_attention_heads,
            "num_key_value_heads": self.num_key_value_heads,
            "head_dim": self.head_dim,
            "layer_types": list(self.layer_types),
            "sliding_window": self.sliding_window,
            "rms_norm_eps": self.rms_norm_eps,
            "rope_theta": self.rope_theta,
            "block_size": self.block_size,
            "dflash_config": {
                "mask_token_id": self.mask_token_id,
                "target_layer_ids": list(self.target_layer_ids),
            },
        }


# The published Qwen3.6-35B-A3B companion (UPSTREAM.md: z-lab/Qwen3.6-35B-A3B-DFlash rev f181eece).
PUBLISHED_35B_A3B = DFlashConfig(
    hidden_size=2048,
    intermediate_size=6144,
    num_hidden_layers=6,
    num_attention_heads=32,
    num_key_value_heads=8,
    head_dim=128,
    layer_types=(SLIDING,) * 5 + (FULL,),
    sliding_window=4096,
    block_size=16,
    mask_token_id=248077,
    target_layer_ids=(1, 6, 11, 16, 22, 27, 32, 37),
)


def expected_shapes(c: DFlashConfig) -> dict[str, tuple[int, ...]]:
    """Checkpoint name -> shape for every tensor of a companion of geometry `c`."""
    h, d = c.hidden_size, c.head_dim
    out: dict[str, tuple[int, ...]] = {
        "fc.weight": (h, len(c.target_layer_ids) * h),
        "hidden_norm.weight": (h,),
        "norm.weight": (h,),
    }
    for i in range(c.num_hidden_layers):
        p = f"layers.{i}"
        out |= {
            f"{p}.self_attn.q_proj.weight": (c.num_attention_heads * d, h),
            f"{p}.self_attn.k_proj.weight": (c.num_key_value_heads * d, h),
            f"{p}.self_attn.v_proj.weight": (c.num_key_value_heads * d, h),
            f"{p}.self_attn.o_proj.weight": (h, c.num_attention_heads * d),
            f"{p}.self_attn.q_norm.weight": (d,),
            f"{p}.self_attn.k_norm.weight": (d,),
            f"{p}.mlp.gate_proj.weight": (c.intermediate_size, h),
            f"{p}.mlp.up_proj.weight": (c.intermediate_size, h),
            f"{p}.mlp.down_proj.weight": (h, c.intermediate_size),
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
        }
    return out


class PlainRMSNorm(nn.Module):
    """Qwen3's RMSNorm: ``w * (x / rms(x))``, the statistics in fp32, the product in the input dtype."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        xf = x.float()
        normed = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * normed.to(x.dtype)


class Proj(nn.Module):
    """A bias-free projection holding the checkpoint's ``weight`` [out, in]."""

    def __init__(self, n_in: int, n_out: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.empty(n_out, n_in), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight)


def rope_cos_sin(positions: torch.Tensor, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """Plain RoPE tables for `positions` [...] -> cos, sin [..., head_dim] (fp32)."""
    inv_freq = 1.0 / theta ** (
        torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim
    )
    freqs = positions.float().unsqueeze(-1) * inv_freq
    table = torch.cat([freqs, freqs], dim=-1)
    return table.cos(), table.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """x [..., heads, D] with cos/sin [..., D] (rotate-half form), in x's dtype."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    out = x.float() * cos.unsqueeze(-2) + rotated.float() * sin.unsqueeze(-2)
    return out.to(x.dtype)


class DFlashAttention(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        h, d = c.hidden_size, c.head_dim
        self.q_proj = Proj(h, c.num_attention_heads * d)
        self.k_proj = Proj(h, c.num_key_value_heads * d)
        self.v_proj = Proj(h, c.num_key_value_heads * d)
        self.o_proj = Proj(c.num_attention_heads * d, h)
        self.q_norm = PlainRMSNorm(d, c.rms_norm_eps)
        self.k_norm = PlainRMSNorm(d, c.rms_norm_eps)


class DFlashMLP(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.gate_proj = Proj(c.hidden_size, c.intermediate_size)
        self.up_proj = Proj(c.hidden_size, c.intermediate_size)
        self.down_proj = Proj(c.intermediate_size, c.hidden_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DFlashLayer(nn.Module):
    def __init__(self, c: DFlashConfig) -> None:
        super().__init__()
        self.self_attn = DFlashAttention(c)
        self.mlp = DFlashMLP(c)
        self.input_layernorm = PlainRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.post_attention_layernorm = PlainRMSNorm(c.hidden_size, c.rms_norm_eps)


class DFlashDraftModel(nn.Module):
    """Use: `context_kv(features, positions)` for every position the target computes (store the result),
    then `forward_block(embeds, positions, context)` to draft a block."""

    def __init__(self, config: DFlashConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.fc = Proj(len(c.target_layer_ids) * c.hidden_size, c.hidden_size)
        self.hidden_norm = PlainRMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList(DFlashLayer(c) for _ in range(c.num_hidden_layers))
        self.norm = PlainRMSNorm(c.hidden_size, c.rms_norm_eps)

    def _layer(self, i: int) -> DFlashLayer:
        layer = self.layers[i]
        assert isinstance(layer, DFlashLayer)
        return layer

    def _kv(
        self, attn: DFlashAttention, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        c = self.config
        k = attn.k_norm(attn.k_proj(x).view(-1, c.num_key_value_heads, c.head_dim))
        v = attn.v_proj(x).view(-1, c.num_key_value_heads, c.head_dim)
        return apply_rope(k, cos, sin), v

    def _attend(
        self, q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, visible: torch.Tensor
    ) -> torch.Tensor:
        """Attention of q [B * S, Hq, D] over keys / values [B, C, Hkv, D] where `visible` [B, S, C]: [B * S, Hq * D].
        Query head h reads KV head h // G (G = Hq / Hkv) with the G query heads of a KV head folded into its query
        rows ([B, Hkv, G * S, D]): no repeated copy of the context, and SDPA keeps a fused backend (with a mask,
        `enable_gqa` falls back to the math backend, which repeats K / V and materialises the scores)."""
        c = self.config
        b, s, _ = visible.shape
        hkv, g, d = c.num_key_value_heads, c.num_attention_heads // c.num_key_value_heads, c.head_dim
        folded = q.view(b, s, hkv, g, d).permute(0, 2, 3, 1, 4).reshape(b, hkv, g * s, d)
        mask = visible[:, None, None].expand(b, 1, g, s, -1).reshape(b, 1, g * s, -1)
        out = F.scaled_dot_product_attention(
            folded, keys.transpose(1, 2), values.transpose(1, 2), attn_mask=mask, scale=d**-0.5
        )  # [B, Hkv, G * S, D]
        return out.view(b, hkv, g, s, d).permute(0, 3, 1, 2, 4).reshape(b * s, hkv * g * d)

    def context_kv(
        self, features: torch.Tensor, positions: torch.Tensor
    ) -> list[tuple[torch.Tensor, torch.Tensor]]:
        """Per draft layer (K, V) [N, Hkv, D] of target positions `positions` [N] from their features
        [N, len(target_layer_ids) * H] (K roped at its position)."""
        ctx = self.hidden_norm(self.fc(features))
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        return [self._kv(self._layer(i).self_attn, ctx, cos, sin) for i in range(len(self.layers))]

    def forward_block(
        self, embeds: torch.Tensor, positions: torch.Tensor, context: ContextFor
    ) -> torch.Tensor:
        """Final hidden states [B, S, H] of B blocks: `embeds` [B, S, H] (the target's embedding of anchor then
        masks), `positions` [B, S]; `context(layer)` gives that layer's context keys (see `ContextFor`)."""
        c = self.config
        b, s, h = embeds.shape
        cos, sin = rope_cos_sin(positions.reshape(-1), c.head_dim, c.rope_theta)
        hidden = embeds.reshape(b * s, h)
        for i in range(len(self.layers)):
            layer = self._layer(i)
            attn = layer.self_attn
            x = layer.input_layernorm(hidden)
            q = apply_rope(
                attn.q_norm(attn.q_proj(x).view(b * s, c.num_attention_heads, c.head_dim)), cos, sin
            )
            k, v = self._kv(attn, x, cos, sin)
            ctx_k, ctx_v, ctx_pos, ctx_valid = context(i)
            keys = torch.cat([ctx_k.to(k.dtype), k.view(b, s, *k.shape[1:])], dim=1)  # [B, C + S, Hkv, D]
            values = torch.cat([ctx_v.to(v.dtype), v.view(b, s, *v.shape[1:])], dim=1)
            key_pos = torch.cat([ctx_pos, positions], dim=1)  # [B, C + S]
            valid = torch.cat([ctx_valid, torch.ones_like(positions, dtype=torch.bool)], dim=1)
            visible = valid[:, None, :].expand(b, s, -1)
            window = c.window(i)
            if window is not None:
                visible = visible & ((positions[:, :, None] - key_pos[:, None, :]).abs() < window)
            hidden = hidden + attn.o_proj(self._attend(q, keys, values, visible))
            hidden = hidden + layer.mlp(layer.post_attention_layernorm(hidden))
        return self.norm(hidden).view(b, s, h)


def random_dflash(
    config: DFlashConfig,
    seed: int = 0,
    *,
    device: torch.device | str = "cpu",
    dtype: torch.dtype = torch.float32,
) -> DFlashDraftModel:
    """A companion of geometry `config` with seeded random weights drawn on `device` (tests, `--synthetic`)."""
    with torch.device("meta"):
        model = DFlashDraftModel(config)
    model = model.to_empty(device=torch.device(device)).to(dtype)
    gen = torch.Generator(device=torch.device(device)).manual_seed(seed)
    with torch.no_grad():
        for _, param in sorted(model.named_parameters()):
            if param.dim() >= 2:
                param.normal_(0.0, param.shape[1] ** -0.5, generator=gen)
            else:
                param.fill_(1.0)
    return model.requires_grad_(False).eval()


def build_dflash(
    config: DFlashConfig,
    tensors: dict[str, torch.Tensor],
    device: torch.device | str = "cpu",
    dtype: torch.dtype | None = None,
) -> DFlashDraftModel:
    """The companion from its checkpoint tensors (names as `expected_shapes`); ValueError naming every missing,
    unexpected or misshapen tensor."""
    want = expected_shapes(config)
    problems = [f"missing {n}" for n in want if n not in tensors]
    problems += [f"unexpected {n}" for n in tensors if n not in want]
    problems += [
        f"{n}: shape {tuple(t.shape)}, expected {want[n]}"
        for n, t in tensors.items()
        if n in want and tuple(t.shape) != want[n]
    ]
    if problems:
        raise ValueError("DFlash companion weights: " + "; ".join(problems[:20]))
    with torch.device("meta"):
        model = DFlashDraftModel(config)
    state = {n: t.to(device=device, dtype=dtype or t.dtype) for n, t in tensors.items()}
    model.load_state_dict(state, strict=True, assign=True)
    return model.requires_grad_(False).eval()


def check_target(config: DFlashConfig, hidden_size: int, num_layers: int, is_moe: bool, vocab: int) -> None:
    """ValueError unless the target can host this companion: DFlash is published for Qwen3.6-35B-A3B only (the
    MoE family; the tiny MoE test models count), whose hidden width and feature layers it must match."""
    if not is_moe:
        raise ValueError(
            "--spec dflash: DFlash drafts for the Qwen3.6-35B-A3B (MoE) target only; this model is dense "
            "(use --spec mtp)"
        )
    if config.hidden_size != hidden_size:
        raise ValueError(
            f"--spec dflash: the companion's hidden size {config.hidden_size} != the target's {hidden_size}"
        )
    if max(config.target_layer_ids) >= num_layers:
        raise ValueError(
            f"--spec dflash: feature layers {list(config.target_layer_ids)} past the target's {num_layers} layers"
        )
    if not 0 <= config.mask_token_id < vocab:
        raise ValueError(f"--spec dflash: mask token {config.mask_token_id} outside the vocabulary ({vocab})")


def features_width(config: DFlashConfig) -> int:
    return len(config.target_layer_ids) * config.hidden_size


__all__: Sequence[str] = (
    "PUBLISHED_35B_A3B",
    "DFlashConfig",
    "DFlashDraftModel",
    "build_dflash",
    "check_target",
    "expected_shapes",
    "random_dflash",
)
