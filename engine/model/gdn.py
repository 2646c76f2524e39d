"""Gated DeltaNet token mixer (Qwen3.5 ``linear_attn``).

in_proj_qkv -> causal depthwise conv1d (SiLU) over the concatenated q|k|v channels -> split heads;
``beta = sigmoid(b)``, ``g = -exp(A_log) * softplus(a + dt_bias)`` (fp32); the gated delta rule from
the sequence's saved state (chunked for multi-token chunks, recurrent for single tokens); per-head
gated RMSNorm with ``z`` as the gate; out_proj. Conv and recurrent states live in the slot pool of
``ModelCache`` at index ``state_index``; this layer reads and writes only the slots the batch names.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig
from engine.model.forward import ForwardBatch, ModelCache
from engine.model.norm import GatedRMSNorm
from kernels.conv import causal_conv1d_varlen_ref
from kernels.gdn import gated_delta_rule_varlen_ref


class _Conv1dWeight(nn.Module):
    """Holds ``conv1d.weight`` [conv_dim, 1, K] under the checkpoint's name (HF stores an nn.Conv1d)."""

    def __init__(self, channels: int, kernel: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(channels, 1, kernel), requires_grad=False)


class GatedDeltaNet(nn.Module):
    def __init__(self, config: ModelConfig, state_index: int) -> None:
        super().__init__()
        self.state_index = state_index  # which entry of ModelCache.conv_state / recurrent_state
        self.num_k_heads = config.linear_num_key_heads
        self.num_v_heads = config.linear_num_value_heads
        self.k_dim = config.linear_key_head_dim
        self.v_dim = config.linear_value_head_dim
        self.key_dim, self.value_dim = config.linear_key_dim, config.linear_value_dim
        hidden = config.hidden_size
        self.in_proj_qkv = nn.Linear(hidden, config.conv_dim, bias=False)
        self.in_proj_z = nn.Linear(hidden, self.value_dim, bias=False)
        self.in_proj_b = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.in_proj_a = nn.Linear(hidden, self.num_v_heads, bias=False)
        self.conv1d = _Conv1dWeight(config.conv_dim, config.linear_conv_kernel_dim)
        self.dt_bias = nn.Parameter(torch.ones(self.num_v_heads), requires_grad=False)
        self.A_log = nn.Parameter(torch.zeros(self.num_v_heads), requires_grad=False)
        self.norm = GatedRMSNorm(self.v_dim, config.rms_norm_eps)
        self.out_proj = nn.Linear(self.value_dim, hidden, bias=False)

    def forward(self, x: torch.Tensor, batch: ForwardBatch, cache: ModelCache) -> torch.Tensor:
        num_tokens = x.shape[0]
        mixed = causal_conv1d_varlen_ref(
            self.in_proj_qkv(x),
            self.conv1d.weight.squeeze(1),
            cache.conv_state[self.state_index],
            batch.query_start_loc,
            batch.state_slots,
            batch.has_initial_state,
            activation="silu",
        )
        query, key, value = mixed.split([self.key_dim, self.key_dim, self.value_dim], dim=-1)
        beta = torch.sigmoid(self.in_proj_b(x))
        g = -self.A_log.float().exp() * F.softplus(self.in_proj_a(x).float() + self.dt_bias.float())
        core = gated_delta_rule_varlen_ref(
            query.reshape(num_tokens, self.num_k_heads, self.k_dim),
            key.reshape(num_tokens, self.num_k_heads, self.k_dim),
            value.reshape(num_tokens, self.num_v_heads, self.v_dim),
            g,
            beta,
            cache.recurrent_state[self.state_index],
            batch.query_start_loc,
            batch.state_slots,
            batch.has_initial_state,
        )
        z = self.in_proj_z(x).view(num_tokens, self.num_v_heads, self.v_dim)
        return self.out_proj(self.norm(core, z).reshape(num_tokens, self.value_dim))
