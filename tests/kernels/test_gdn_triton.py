"""Gated DeltaNet on the GPU: the fused decode step vs its reference, and fla-core's chunked prefill
(behind ``chunk_gated_delta_rule``) vs ``chunk_gated_delta_rule_ref``."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from kernels.gdn import (
    chunk_gated_delta_rule,
    chunk_gated_delta_rule_ref,
    gated_delta_rule_decode,
    gated_delta_rule_decode_ref,
)

pytestmark = pytest.mark.gpu


def _decode_inputs(
    batch: int, hk: int, hv: int, dk: int, dv: int, device: str, dtype: torch.dtype = torch.bfloat16
) -> tuple[torch.Tensor, ...]:
    # q/k/v as views of one conv-output row, as the model produces them
    mixed = torch.randn(batch, 2 * hk * dk + hv * dv, device=device, dtype=dtype)
    q = mixed[:, : hk * dk].view(batch, hk, dk)
    k = mixed[:, hk * dk : 2 * hk * dk].view(batch, hk, dk)
    v = mixed[:, 2 * hk * dk :].view(batch, hv, dv)
    a = torch.randn(batch, hv, device=device, dtype=dtype)
    b = torch.randn(batch, hv, device=device, dtype=dtype)
    A_log = torch.randn(hv, device=device) * 0.5
    dt_bias = torch.randn(hv, device=device) * 0.5
    return q, k, v, a, b, A_log, dt_bias


@pytest.mark.parametrize(
    ("batch", "hk", "hv", "dk", "dv"),
    [(1, 16, 48, 128, 128), (8, 16, 48, 128, 128), (3, 2, 6, 60, 20), (2, 1, 1, 16, 40)],
)
def test_decode_step_matches_reference(batch, hk, hv, dk, dv, device, assert_close):
    inputs = _decode_inputs(batch, hk, hv, dk, dv, device)
    num_slots = batch + 2
    pool = torch.randn(num_slots, hv, dk, dv, device=device) * 0.1
    slots = torch.randperm(num_slots, device=device)[:batch]
    keep = torch.ones(batch, dtype=torch.bool, device=device)
    if batch > 2:
        keep[0] = False
        pool[slots[0]] = float("nan")  # a fresh sequence must not read its slot's stale state
        slots[2] = -1  # a padding row
    ref_pool = pool.clone()
    expected = gated_delta_rule_decode_ref(*inputs, ref_pool, slots, keep)
    out = gated_delta_rule_decode(*inputs, pool, slots, keep)
    assert_close("out", out, expected, 4e-3, 1.6e-2)
    assert_close("states", pool.nan_to_num(7.0), ref_pool.nan_to_num(7.0), 1e-5, 1e-6)


@pytest.mark.parametrize(("batch", "hk", "hv", "dk", "dv"), [(4, 16, 48, 128, 128), (3, 2, 6, 60, 20)])
def test_decode_step_out_of_place_matches_reference(batch, hk, hv, dk, dv, device, assert_close):
    """out_slots (columns of a slot table, as the speculative verify passes them): the state read from
    state_slots and written to out_slots; padding rows (-1) and a row whose out slot is -1 write nothing;
    the source slots keep their state bit for bit. fp32 activations: the slots are under test, and Triton
    3.6's interpreter truncates fp32 -> bf16 (the GPU rounds), which the bf16 tests' tolerances do not take."""
    inputs = _decode_inputs(batch, hk, hv, dk, dv, device, torch.float32)
    num_slots = 3 * batch + 2
    pool = torch.randn(num_slots, hv, dk, dv, device=device) * 0.1
    table = torch.randperm(num_slots, device=device)[: 3 * batch].view(batch, 3)  # [B, 3]: in, out, spare
    slots, out_slots = table[:, 0], table[:, 1]
    keep = torch.ones(batch, dtype=torch.bool, device=device)
    keep[0] = False
    table[1, :2] = -1  # a padding row: -1 in and out
    table[2, 1] = -1  # a row that writes no state
    before = pool.clone()
    ref_pool = pool.clone()
    expected = gated_delta_rule_decode_ref(*inputs, ref_pool, slots, keep, out_slots=out_slots)
    out = gated_delta_rule_decode(*inputs, pool, slots, keep, out_slots=out_slots)
    assert_close("out", out, expected, 4e-3, 1.6e-2)
    assert_close("states", pool, ref_pool, 1e-5, 1e-6)
    written = [s for s in out_slots.tolist() if s >= 0]
    kept = [s for s in range(num_slots) if s not in written]
    assert torch.equal(pool[kept], before[kept]), "only the out slots may change"
    assert not torch.equal(pool[written], before[written])


def test_decode_steps_chain_through_the_pool(device, assert_close):
    """32 steps in a row: errors must not grow through the recurrent state."""
    pool = torch.zeros(2, 48, 128, 128, device=device)
    ref_pool = pool.clone()
    slots = torch.tensor([1], device=device)
    keep = torch.ones(1, dtype=torch.bool, device=device)
    for _ in range(32):
        inputs = _decode_inputs(1, 16, 48, 128, 128, device)
        out = gated_delta_rule_decode(*inputs, pool, slots, keep)
        expected = gated_delta_rule_decode_ref(*inputs, ref_pool, slots, keep)
    assert_close("out", out, expected, 4e-3, 1.6e-2)
    assert_close("states", pool, ref_pool, 1e-4, 1e-5)


@pytest.mark.parametrize(
    ("batch", "tokens", "hk", "hv", "dk", "dv"), [(1, 1000, 16, 48, 128, 128), (2, 63, 2, 6, 64, 64)]
)
def test_chunked_prefill_fla_matches_reference(batch, tokens, hk, hv, dk, dv, device, assert_close):
    pytest.importorskip("fla.ops.gated_delta_rule")
    q = torch.randn(batch, tokens, hk, dk, device=device, dtype=torch.bfloat16)
    k = torch.randn(batch, tokens, hk, dk, device=device, dtype=torch.bfloat16)
    v = torch.randn(batch, tokens, hv, dv, device=device, dtype=torch.bfloat16)
    g = -F.softplus(torch.randn(batch, tokens, hv, device=device)) * 0.5
    beta = torch.rand(batch, tokens, hv, device=device, dtype=torch.bfloat16)
    init = torch.randn(batch, hv, dk, dv, device=device) * 0.1
    ref_out, ref_state = chunk_gated_delta_rule_ref(q, k, v, g, beta, init)
    out, state = chunk_gated_delta_rule(q, k, v, g, beta, init)
    # fla-core computes its intra-chunk products in bf16 on tensor cores: bf16-level agreement.
    assert_close("out", out, ref_out, 1e-2, 5e-2)
    assert_close("state", state, ref_state, 1e-2, 5e-2)
