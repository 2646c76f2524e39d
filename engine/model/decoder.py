"""One pre-norm decoder layer: token mixer (GDN or gated attention) then feed-forward, each residual.

``forward`` is the plain form (the MTP head uses it). ``forward_fused`` is the form the decoder stack
runs: it takes the already-normed input and the residual stream, and fuses each residual add with the
norm that follows it (``add_rms_norm``), the last one being the next layer's input norm (or the final
norm). Both compute the same values bit for bit: the add rounds to the model dtype before the norm.
"""

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

    def _mix(
        self,
        normed: torch.Tensor,
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        cache: ModelCache,
    ) -> torch.Tensor:
        # NOTE: ``.forward`` directly, not the module call: nn.Module's hook machinery costs ~1 us a call, and
        # run eagerly the host's Python per layer is the decode step's time (hooks on these modules do not run)
        if self.layer_type == "linear_attention":
            return self.linear_attn.forward(normed, batch, cache)
        return self.self_attn.forward(normed, rope, batch, cache)

    def forward(
        self,
        hidden: torch.Tensor,  # [T, hidden]
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        cache: ModelCache,
    ) -> torch.Tensor:
        mixed = self._mix(self.input_layernorm(hidden), rope, batch, cache)
        normed, hidden = self.post_attention_layernorm.add_forward(mixed, hidden)
        return hidden + self.mlp(normed)

    def forward_fused(
        self,
        normed: torch.Tensor,  # input_layernorm(residual), [T, hidden]
        residual: torch.Tensor,  # [T, hidden]
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        cache: ModelCache,
        next_norm: RMSNorm,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """-> (next_norm(h), h) with h this layer's output residual stream."""
        mixed = self._mix(normed, rope, batch, cache)
        normed, residual = self.post_attention_layernorm.add_forward(mixed, residual)
        return next_norm.add_forward(self.mlp.forward(normed), residual)
