"""Triton quantized routed experts vs ``quant_moe_experts_ref``: Q4/Q5/Q6/W8 stacks, a down K that pads
(I = 96 -> K_pad 128), T = 1..6, repeated experts, bitwise batch invariance (GPU; or CPU under
TRITON_INTERPRET=1)."""

from __future__ import annotations

import pytest
import torch
from test_quant_moe import TOP_K, E, H, make_experts

from kernels.moe import moe_route_ref
from kernels.quant import Q4, Q5, Q6, W8
from kernels.quant.quant_moe import quant_moe_experts, quant_moe_experts_ref

pytestmark = pytest.mark.gpu

# fp32 sums in another order, one bf16 output rounding (truncation under the interpreter)
RMS = 6e-3


@pytest.mark.parametrize(("gu", "dn"), [(Q4, Q5), (Q4, Q6), (W8, W8)])
@pytest.mark.parametrize("tokens", [1, 6])
def test_matches_reference(gu, dn, tokens, device, assert_close):
    gate_up, down, _, _ = make_experts(gu, dn, device)
    x = torch.randn(tokens, H, device=device).bfloat16()
    weights, ids = moe_route_ref(torch.randn(tokens, E, device=device), TOP_K)
    ids[0] = torch.tensor([E - 1, 0])  # the last expert's rows: the stacks' ends
    got = quant_moe_experts(x, gate_up, down, weights, ids)
    assert got.dtype == x.dtype
    assert_close(
        f"{gu}/{dn} T={tokens}", got, quant_moe_experts_ref(x, gate_up, down, weights, ids), RMS, 0.0
    )


def test_batch_invariance(device):
    gate_up, down, _, _ = make_experts(Q4, Q5, device)
    x = torch.randn(5, H, device=device).bfloat16()
    weights, ids = moe_route_ref(torch.randn(5, E, device=device), TOP_K)
    full = quant_moe_experts(x, gate_up, down, weights, ids)
    for i in range(5):
        alone = quant_moe_experts(x[i : i + 1], gate_up, down, weights[i : i + 1], ids[i : i + 1])
        assert torch.equal(alone[0], full[i]), f"token {i}: alone differs from the batch"
