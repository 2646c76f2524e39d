"""The MTP (multi-token prediction) head of the Qwen3.5 checkpoints, used as the speculative drafter.

Weights (checkpoint names, ``mtp.`` prefix; embedding and lm_head are shared with the base model):
``pre_fc_norm_embedding``, ``pre_fc_norm_hidden`` ((1 + w) RMSNorms), ``fc`` ([H, 2H], no bias),
``layers.{i}.*`` (full-attention decoder layers: dense MLP, or MoE for the MoE model), ``norm``.

    h_out = norm(layer(fc(concat(pre_fc_norm_embedding(embed(token)), pre_fc_norm_hidden(hidden)))))

The embedding comes first in the concat (vLLM ``qwen3_5_mtp.py``). ``hidden`` is the base model's
final (post-norm) hidden state at position ``p`` and ``token`` the token at ``p + 1``; the layer
runs at position ``p`` with its own KV cache entries (after the base model's attention layers).
"""

from __future__ import annotations

import torch
from torch import nn

from engine.model.config import ModelConfig
from engine.model.decoder import DecoderLayer
from engine.model.forward import ForwardBatch, ModelCache
from engine.model.linear import Linear
from engine.model.norm import RMSNorm


class MultiTokenPredictor(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.pre_fc_norm_embedding = RMSNorm(hidden, config.rms_norm_eps)
        self.pre_fc_norm_hidden = RMSNorm(hidden, config.rms_norm_eps)
        self.fc = Linear(2 * hidden, hidden)
        first_kv = config.num_attention_layers
        self.layers = nn.ModuleList(
            DecoderLayer(config, "full_attention", first_kv + i) for i in range(config.mtp_num_hidden_layers)
        )
        self.norm = RMSNorm(hidden, config.rms_norm_eps)

    def forward(
        self,
        embeds: torch.Tensor,  # [T, hidden], embedding of the next tokens
        target_hidden: torch.Tensor,  # [T, hidden], base model final hidden states
        rope: tuple[torch.Tensor, torch.Tensor],
        batch: ForwardBatch,
        cache: ModelCache,
        step: int = 0,
    ) -> torch.Tensor:
        fused = torch.cat(
            [self.pre_fc_norm_embedding(embeds), self.pre_fc_norm_hidden(target_hidden)], dim=-1
        )
        hidden = self.fc(fused)
        hidden = self.layers[step % len(self.layers)](hidden, rope, batch, cache)
        return self.norm(hidden)
