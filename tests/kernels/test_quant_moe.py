"""Quantized routed experts' reference (CPU): ``quant_moe_experts_ref`` is ``moe_experts_ref`` on the exactly
decoded stacked weights; the launcher runs it where no kernel runs, and refuses mismatched stacks."""

from __future__ import annotations

import pytest
import torch

from kernels.moe import moe_experts_ref, moe_route_ref
from kernels.quant import Q4, Q5, Q6, W8, decode_ref, encode, view_planes
from kernels.quant.quant_moe import quant_moe_experts, quant_moe_experts_ref

E, H, INTER, TOP_K = 8, 128, 96, 2


def make_experts(gate_up_fmt: str, down_fmt: str, device: str = "cpu"):
    gu_w = torch.randn(E * 2 * INTER, H) * H**-0.5
    dn_w = torch.randn(E * H, INTER) * INTER**-0.5
    gu_p, dn_p = encode(gate_up_fmt, gu_w), encode(down_fmt, dn_w)
    gate_up = view_planes(gate_up_fmt, gu_p.to(device), (E * 2 * INTER, H))
    down = view_planes(down_fmt, dn_p.to(device), (E * H, INTER))
    return (
        gate_up,
        down,
        decode_ref(gate_up_fmt, gu_p, (E * 2 * INTER, H)),
        decode_ref(down_fmt, dn_p, (E * H, INTER)),
    )


@pytest.mark.parametrize(("gu", "dn"), [(Q4, Q5), (Q4, Q6), (W8, W8)])
def test_reference_is_moe_experts_on_decoded_weights(gu, dn):
    gate_up, down, gu_dec, dn_dec = make_experts(gu, dn)
    x = torch.randn(5, H).bfloat16()
    weights, ids = moe_route_ref(torch.randn(5, E), TOP_K)
    expected = moe_experts_ref(x, gu_dec.view(E, 2 * INTER, H), dn_dec.view(E, H, INTER), weights, ids)
    assert torch.equal(quant_moe_experts_ref(x, gate_up, down, weights, ids), expected)
    assert torch.equal(quant_moe_experts(x, gate_up, down, weights, ids), expected)  # CPU: the reference


def test_mismatched_stacks_are_refused():
    gate_up, down, _, _ = make_experts(Q4, Q5)
    weights, ids = moe_route_ref(torch.randn(2, E), TOP_K)
    with pytest.raises(AssertionError, match="gate_up"):
        quant_moe_experts_ref(torch.randn(2, H), gate_up.rows(0, 2 * INTER), down, weights, ids)
