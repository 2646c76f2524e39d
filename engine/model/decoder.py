"""One pre-norm decoder layer: token mixer (GDN or gated attention) then feed-forward, each residual."""

from __future__ import annotations

import torch
from torch import nn

from engine.model.attention import GatedAttention
from engine.model.config import ModelConfig
from engine.model.forward import ForwardBatch, ModelCache
from engine.model.gdn import GatedDeltaNet
from engine.model.mlp import make_feed_forward
from engine.model.norm import RMSNorm


class DecoderLayer(nn.Module):
    def __init__(self, config: ModelConfig, layer_type: str, cache_index: int) -> None:
        """cache_index: the KV entry (attention) or state entry (GDN) of ModelCache this layer owns."""
        super().__init__()
        self.layer_type = layer_type
        if layer_type == "linear_attention":
            self.linear_attn = GatedDeltaNet(config, cache_index)
        else:
            self.self_attn = GatedAttention(config, cache_index)
        self.mlp = make_feed_forward(config)
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        cache: ModelCache,
    ) -> torch.Tensor:
        mixed_in = self.input_layernorm(hidden)
        if self.layer_type == "linear_attention":
            mixed = self.linear_attn(mixed_in, batch, cache)
        else:
            mixed = self.self_attn(mixed_in, rope, batch, cache)
        hidden = hidden + mixed
        return hidden + self.mlp(self.post_attention_layernorm(hidden))
