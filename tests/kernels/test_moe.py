"""MoE references: softmax top-k renormalised routing and the weighted expert sum, vs naive loops."""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from kernels.moe import SharedExpert, moe_experts_ref, moe_route_ref


def test_route_is_softmax_topk_renormalised():
    logits = torch.randn(63, 7)
    weights, ids = moe_route_ref(logits, 3)
    for t in range(63):
        exps = [math.exp(v) for v in logits[t].tolist()]
        probs = [e / sum(exps) for e in exps]
        best = sorted(range(7), key=lambda e: -probs[e])[:3]
        assert ids[t].tolist() == best
        kept = sum(probs[e] for e in best)
        for j, e in enumerate(best):
            assert abs(weights[t, j].item() - probs[e] / kept) < 1e-6
    assert torch.allclose(weights.sum(-1), torch.ones(63))


def test_route_without_renormalise_keeps_probabilities():
    logits = torch.randn(5, 6)
    weights, ids = moe_route_ref(logits, 2, renormalize=False)
    assert torch.allclose(weights, logits.softmax(-1).gather(1, ids))


def test_experts_weighted_sum_matches_per_token_loop(assert_close):
    tokens, hidden, inter, experts = 63, 20, 14, 5
    x = torch.randn(tokens, hidden)
    gate_up, down = torch.randn(experts, 2 * inter, hidden), torch.randn(experts, hidden, inter)
    weights, ids = moe_route_ref(torch.randn(tokens, experts), 2)
    expected = torch.zeros(tokens, hidden)
    for t in range(tokens):
        for j in range(2):
            e = ids[t, j].item()
            gate, up = gate_up[e, :inter] @ x[t], gate_up[e, inter:] @ x[t]
            expected[t] += weights[t, j] * (down[e] @ (F.silu(gate) * up))
    assert_close("moe", moe_experts_ref(x, gate_up, down, weights, ids), expected)


def test_experts_with_shared_add_the_gated_shared_expert(assert_close):
    """HF Qwen3_5MoeSparseMoeBlock: routed sum + sigmoid(shared_expert_gate . x) * shared_expert(x)."""
    tokens, hidden, inter, shared_inter, experts = 9, 20, 14, 22, 5
    x = torch.randn(tokens, hidden)
    gate_up, down = torch.randn(experts, 2 * inter, hidden), torch.randn(experts, hidden, inter)
    weights, ids = moe_route_ref(torch.randn(tokens, experts), 2)
    shared = SharedExpert(
        torch.randn(shared_inter, hidden),
        torch.randn(shared_inter, hidden),
        torch.randn(hidden, shared_inter),
        torch.randn(1, hidden),
    )
    expected = moe_experts_ref(x, gate_up, down, weights, ids)
    for t in range(tokens):
        act = F.silu(shared.gate_proj @ x[t]) * (shared.up_proj @ x[t])
        expected[t] += torch.sigmoid(shared.gate[0] @ x[t]) * (shared.down_proj @ act)
    assert_close("moe + shared", moe_experts_ref(x, gate_up, down, weights, ids, shared), expected)
