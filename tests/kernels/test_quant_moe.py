"""Quantized routed experts' reference (CPU): ``quant_moe_experts_ref`` is ``moe_experts_ref`` on the exactly
decoded stacked weights; the launcher runs it where no kernel runs, and refuses mismatched stacks."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from kernels.moe import moe_experts_ref, moe_route_ref
from kernels.quant import Q4, Q5, Q6, W8, decode_ref, encode, quant_moe, view_planes
from kernels.quant.quant_moe import (
    QUANT_MOE_V2_VARIANTS,
    quant_moe_experts,
    quant_moe_experts_ref,
    quant_moe_tiles_v2,
)

E, H, INTER, TOP_K = 8, 128, 96, 2


def make_experts(
    gate_up_fmt: str, down_fmt: str, device: str = "cpu", e: int = E, h: int = H, inter: int = INTER
):
    """Random expert stacks (gate_up [e * 2 * inter, h], down [e * h, inter]) encoded in the two formats: the
    (gate_up, down) plane views on ``device`` and their exact decodes (CPU)."""
    gu_w = torch.randn(e * 2 * inter, h) * h**-0.5
    dn_w = torch.randn(e * h, inter) * inter**-0.5
    gu_p, dn_p = encode(gate_up_fmt, gu_w), encode(down_fmt, dn_w)
    gate_up = view_planes(gate_up_fmt, gu_p.to(device), (e * 2 * inter, h))
    down = view_planes(down_fmt, dn_p.to(device), (e * h, inter))
    return (
        gate_up,
        down,
        decode_ref(gate_up_fmt, gu_p, (e * 2 * inter, h)),
        decode_ref(down_fmt, dn_p, (e * h, inter)),
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


def test_v2_tiles_depend_on_the_geometry_only():
    """v2's chunks are the largest power of two under the cap that divides K_pad (never of T); the 35B-A3B
    defaults: 4 gate_up chunks of 512 lanes, 2 down chunks of 256."""
    tiles = quant_moe_tiles_v2(2048, 512)
    assert (tiles.block_k_gate_up, tiles.block_k_down, tiles.block_n, tiles.block_h) == (512, 256, 8, 8)
    assert (
        quant_moe_tiles_v2(384, 640).block_k_gate_up == 128
        and quant_moe_tiles_v2(384, 640).block_k_down == 128
    )
    for name, overrides in QUANT_MOE_V2_VARIANTS.items():
        tiles = quant_moe_tiles_v2(2048, 512, **overrides)
        assert 2048 % tiles.block_k_gate_up == 0 and 512 % tiles.block_k_down == 0, name


def test_repacked_stacks_are_refused(monkeypatch):
    """The kernels read the stored layout; a GEMV-layout (repacked) stack is refused with a clear error, not
    read as garbage (checked where the kernels run: the interpreter stands in for the GPU)."""
    monkeypatch.setattr(quant_moe, "use_triton", lambda *tensors: True)
    gate_up, down, _, _ = make_experts(Q4, Q5)
    weights, ids = moe_route_ref(torch.randn(2, E), TOP_K)
    with pytest.raises(ValueError, match="repack=False"):
        quant_moe_experts(torch.randn(2, H), replace(gate_up, gemv_layout=True), down, weights, ids)


def test_reference_adds_the_shared_term_in_fp32_and_rounds_once():
    """``shared`` is added as given, or weighted by ``sigmoid(shared_gate . x)``, to the unrounded fp32 sum."""
    gate_up, down, _, _ = make_experts(Q4, Q5)
    x = torch.randn(3, H).bfloat16()
    weights, ids = moe_route_ref(torch.randn(3, E), TOP_K)
    shared, score = torch.randn(3, H).bfloat16(), torch.randn(1, H).bfloat16() * H**-0.5
    routed = quant_moe_experts_ref(x.float(), gate_up, down, weights, ids)  # fp32 x: the sum unrounded
    gate = torch.sigmoid(x.float() @ score.float().t())
    plain = quant_moe_experts_ref(x, gate_up, down, weights, ids, shared)
    assert torch.equal(plain, (routed + shared.float()).bfloat16())
    gated = quant_moe_experts_ref(x, gate_up, down, weights, ids, shared, score)
    assert torch.equal(gated, (routed + gate * shared.float()).bfloat16())
    cpu = quant_moe_experts(x, gate_up, down, weights, ids, shared, score)
    assert torch.equal(cpu, gated)  # CPU: the reference
    with pytest.raises(AssertionError, match="a shared gate without a shared expert output"):
        quant_moe_experts_ref(x, gate_up, down, weights, ids, None, score)


def test_grouped_prefill_on_the_cpu_is_its_reference():
    """``quant_moe_grouped`` (``NINFER_MOE_PREFILL=quant``) runs its reference where no kernel runs: the dense
    path's math on the stacks dequantized to x's dtype (fp32 here: ``moe_experts_ref`` on the decoded stacks, to
    fp32 sums)."""
    from engine.model.mlp import expert_groups
    from kernels.quant import quant_moe_grouped, quant_moe_grouped_ref

    gate_up, down, gu_dec, dn_dec = make_experts(Q4, Q6)
    x = torch.randn(70, H)
    weights, ids = moe_route_ref(torch.randn(70, E), TOP_K)
    shared = torch.randn(70, H)
    got = quant_moe_grouped(x, gate_up, down, weights, ids, expert_groups(ids, E), shared)
    assert torch.equal(got, quant_moe_grouped_ref(x, gate_up, down, weights, ids, shared))
    dense = moe_experts_ref(x, gu_dec.view(E, 2 * INTER, H), dn_dec.view(E, H, INTER), weights, ids)
    torch.testing.assert_close(got, dense + shared, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("block_m", [16, 32, 128])
def test_grouped_prefill_grid_covers_every_routing(block_m):
    """``tiles_bound`` (the grouped GEMM's programs along M, from T, top_k, E and BLOCK_M only) is at least the
    M tiles a routing needs (each expert's padded group in BLOCK_M tiles): random, skewed, one-expert routings."""
    from engine.model.mlp import expert_groups
    from kernels.quant.moe_prefill import tiles_bound

    gen = torch.Generator().manual_seed(block_m)
    for tokens, experts, top_k in ((1, 8, 2), (37, 8, 2), (200, 16, 4), (513, 256, 8), (64, 256, 8)):
        for kind in ("random", "skewed", "distinct"):
            if kind == "random":
                ids = torch.stack([torch.randperm(experts, generator=gen)[:top_k] for _ in range(tokens)])
            elif kind == "skewed":  # the same top_k experts for every token
                ids = torch.arange(top_k).expand(tokens, top_k)
            else:  # pairs spread over as many experts as possible (distinct in a row: top_k <= E): most padding
                ids = (torch.arange(tokens * top_k) % experts).view(tokens, top_k)
            groups = expert_groups(ids, experts)
            sizes = groups.offs.diff(prepend=groups.offs.new_zeros(1)).long()
            needed = int(((sizes + block_m - 1) // block_m).sum())
            rows = groups.token_idx.shape[0]
            assert needed <= tiles_bound(rows, tokens * top_k, experts, block_m), (tokens, experts, kind)


def test_grouped_prefill_tiles_at_the_35b_a3b():
    """BLOCK_M follows the rows an expert gets on average (E 256, top_k 8): T = 128 -> 16, 1024 -> 32, 7680 -> 128."""
    from kernels.quant import quant_moe_grouped_tiles

    assert [quant_moe_grouped_tiles(t * 8, 256).block_m for t in (65, 128, 1024, 7680)] == [16, 16, 32, 128]
