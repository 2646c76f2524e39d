"""Mixture-of-experts references: softmax top-k routing and the weighted expert sum.

Routing (HF ``Qwen3_5MoeTopKRouter``): ``probs = softmax(router_logits)`` in fp32, keep the top-k
experts per token, then renormalise the kept probabilities to sum to one. Each expert is a SiLU-gated
MLP whose gate and up projections are stored fused, ``gate_up[e] = [gate; up]`` of shape ``[2I, H]``,
as in the real checkpoints (``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def moe_route_ref(
    router_logits: torch.Tensor, top_k: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [T, E] -> (weights [T, top_k] fp32, expert_ids [T, top_k] int64), best first."""
    probs = router_logits.float().softmax(dim=-1)
    weights, expert_ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, expert_ids


def moe_experts_ref(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
) -> torch.Tensor:
    """``sum_k weights[t, k] * expert_{ids[t, k]}(x[t])`` with ``expert_e(x) = down_e(silu(gate_e x) * up_e x)``.

    x: [T, H]; gate_up: [E, 2I, H]; down: [E, H, I]; weights, expert_ids: [T, top_k] -> [T, H] (x.dtype).
    """
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in expert_ids.unique().tolist():
        token_idx, k_idx = (expert_ids == expert).nonzero(as_tuple=True)
        xe = x[token_idx].float()
        gate, up = (xe @ gate_up[expert].float().t()).chunk(2, dim=-1)
        ye = (F.silu(gate) * up) @ down[expert].float().t()
        out.index_add_(0, token_idx, ye * weights[token_idx, k_idx, None].float())
    return out.to(x.dtype)
