"""Feed-forward blocks: the dense SiLU-gated MLP and the sparse MoE block with a gated shared expert.

MoE (HF ``Qwen3_5MoeSparseMoeBlock``): ``gate`` is the router ([E, H]); experts are stored fused
(``experts.gate_up_proj`` [E, 2I, H], ``experts.down_proj`` [E, H, I]); the output is the routed sum
plus ``sigmoid(shared_expert_gate(x)) * shared_expert(x)``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from engine.model.config import ModelConfig
from kernels.moe import moe_experts_ref, moe_route_ref


class MLP(nn.Module):
    def __init__(self, hidden_size: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Router(nn.Module):
    """``mlp.gate.weight`` [E, H]: router logits."""

    def __init__(self, hidden_size: int, num_experts: int) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(num_experts, hidden_size), requires_grad=False)


class Experts(nn.Module):
    def __init__(self, hidden_size: int, num_experts: int, intermediate_size: int) -> None:
        super().__init__()
        self.gate_up_proj = nn.Parameter(
            torch.zeros(num_experts, 2 * intermediate_size, hidden_size), requires_grad=False
        )
        self.down_proj = nn.Parameter(
            torch.zeros(num_experts, hidden_size, intermediate_size), requires_grad=False
        )


class SparseMoeBlock(nn.Module):
    def __init__(self, config: ModelConfig) -> None:
        super().__init__()
        hidden = config.hidden_size
        self.top_k = config.num_experts_per_tok
        self.gate = Router(hidden, config.num_experts)
        self.experts = Experts(hidden, config.num_experts, config.moe_intermediate_size)
        self.shared_expert = MLP(hidden, config.shared_expert_intermediate_size)
        self.shared_expert_gate = nn.Linear(hidden, 1, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, expert_ids = moe_route_ref(F.linear(x, self.gate.weight), self.top_k)
        routed = moe_experts_ref(x, self.experts.gate_up_proj, self.experts.down_proj, weights, expert_ids)
        shared = torch.sigmoid(self.shared_expert_gate(x)) * self.shared_expert(x)
        return routed + shared


def make_feed_forward(config: ModelConfig) -> nn.Module:
    """The model's feed-forward block: MoE for the MoE model, dense MLP otherwise."""
    if config.is_moe:
        return SparseMoeBlock(config)
    assert config.intermediate_size is not None
    return MLP(config.hidden_size, config.intermediate_size)
