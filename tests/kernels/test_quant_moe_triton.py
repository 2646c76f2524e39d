"""Triton quantized routed experts vs ``quant_moe_experts_ref``, both kernel versions (``NINFER_QUANT_MOE``: v1
``triton_group.py``, v2 ``triton_moe.py``): Q4/Q5/Q6/W8 stacks, a down K that pads (I = 96 -> K_pad 128), odd
geometries for v2 (masked row tiles, top_k 3, several K chunks), T = 1, 3, 6, 8, repeated experts, bitwise batch
invariance, the shared expert's term (as given, or gated) added in the down kernel (GPU; or CPU under
TRITON_INTERPRET=1). The real 35B-A3B geometry runs on a GPU only."""

from __future__ import annotations

import pytest
import torch
from test_quant_moe import TOP_K, E, H, make_experts

from kernels import _dispatch
from kernels._dispatch import INTERPRET
from kernels.moe import moe_route_ref
from kernels.quant import GROUP_FORMATS, Q4, Q5, Q6, W8, QuantWeight, geometry, quant_moe, view_planes
from kernels.quant.quant_moe import (
    QUANT_MOE_V2_VARIANTS,
    quant_moe_experts,
    quant_moe_experts_ref,
    quant_moe_tiles_v2,
)

pytestmark = pytest.mark.gpu

# fp32 sums in another order, one bf16 output rounding (truncation under the interpreter)
RMS = 6e-3
# odd geometries for v2, top_k 3 (BLOCK_TOPK 4: one slot of each down tile reads a zero act), row tiles masked
# (132, 36 and 136 rows are not multiples of 8). Under the "narrow" tiles (chunks of 128 lanes), A (H 132 -> K_pad
# 256) has 2 gate_up chunks and B (I 136 -> K_pad 256) 2 down chunks. Small: the interpreter takes ~10 ms a program.
ODD_A = dict(e=5, h=132, inter=40)
ODD_B = dict(e=4, h=36, inter=136)
ODD_TOP_K = 3


def _route(tokens: int, experts: int, top_k: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    weights, ids = moe_route_ref(torch.randn(tokens, experts, device=device), top_k)
    ids[0, :2] = torch.tensor([experts - 1, 0])  # the last expert's rows: the stacks' ends
    return weights, ids


@pytest.mark.parametrize(("gu", "dn"), [(Q4, Q5), (Q4, Q6), (W8, W8)])
@pytest.mark.parametrize("tokens", [1, 6])
def test_matches_reference(gu, dn, tokens, device, assert_close):
    """v1 (the default) on E 8, H 128, I 96, top_k 2."""
    gate_up, down, _, _ = make_experts(gu, dn, device)
    x = torch.randn(tokens, H, device=device).bfloat16()
    weights, ids = _route(tokens, E, TOP_K, device)
    got = quant_moe_experts(x, gate_up, down, weights, ids, version="v1")
    assert got.dtype == x.dtype
    assert_close(
        f"{gu}/{dn} T={tokens}", got, quant_moe_experts_ref(x, gate_up, down, weights, ids), RMS, 0.0
    )


@pytest.mark.parametrize(
    ("gu", "dn", "geo", "tokens"),
    [(Q4, Q5, "A", 1), (Q4, Q6, "B", 3), (Q6, Q4, "A", 3), (W8, W8, "A", 1)],
)
def test_v2_matches_reference(gu, dn, geo, tokens, device, assert_close):
    """v2 on the odd geometries, T = 1, 3 (T = 8: ``test_v2_batch_invariance``), the Q4/Q5/Q6/W8 mixes."""
    shape = ODD_A if geo == "A" else ODD_B
    gate_up, down, _, _ = make_experts(gu, dn, device, **shape)
    x = torch.randn(tokens, shape["h"], device=device).bfloat16()
    weights, ids = _route(tokens, shape["e"], ODD_TOP_K, device)
    got = quant_moe_experts(x, gate_up, down, weights, ids, version="v2")
    assert got.dtype == x.dtype
    expected = quant_moe_experts_ref(x, gate_up, down, weights, ids)
    assert_close(f"v2 {geo} {gu}/{dn} T={tokens}", got, expected, RMS, 0.0)


@pytest.mark.parametrize(("variant", "geo"), [("narrow", "A"), ("narrow", "B"), ("h4", "A")])
def test_v2_tile_variants_match_reference(variant, geo, device, assert_close):
    """The tile alternatives the H200 run times (other chunks, other row counts) compute the same function."""
    shape = ODD_A if geo == "A" else ODD_B
    gate_up, down, _, _ = make_experts(Q4, Q5, device, **shape)
    x = torch.randn(2, shape["h"], device=device).bfloat16()
    weights, ids = _route(2, shape["e"], ODD_TOP_K, device)
    tiles = quant_moe_tiles_v2(gate_up.k_pad, down.k_pad, **QUANT_MOE_V2_VARIANTS[variant])
    got = quant_moe_experts(x, gate_up, down, weights, ids, version="v2", tiles_v2=tiles)
    assert_close(f"v2 {variant}", got, quant_moe_experts_ref(x, gate_up, down, weights, ids), RMS, 0.0)


def test_batch_invariance(device):
    """v1: every row alone == that row of a batch of 5, bitwise."""
    gate_up, down, _, _ = make_experts(Q4, Q5, device)
    x = torch.randn(5, H, device=device).bfloat16()
    weights, ids = _route(5, E, TOP_K, device)
    full = quant_moe_experts(x, gate_up, down, weights, ids, version="v1")
    for i in range(5):
        alone = quant_moe_experts(
            x[i : i + 1], gate_up, down, weights[i : i + 1], ids[i : i + 1], version="v1"
        )
        assert torch.equal(alone[0], full[i]), f"token {i}: alone differs from the batch"


def test_v2_batch_invariance(device, assert_close):
    """v2 at T = 8 (odd geometry A, Q5 gate_up / Q6 down) against the reference, and rows 0 and 7 alone == those
    rows of the batch, bitwise."""
    gate_up, down, _, _ = make_experts(Q5, Q6, device, **ODD_A)
    x = torch.randn(8, ODD_A["h"], device=device).bfloat16()
    weights, ids = _route(8, ODD_A["e"], ODD_TOP_K, device)
    full = quant_moe_experts(x, gate_up, down, weights, ids, version="v2")
    assert_close("v2 A T=8", full, quant_moe_experts_ref(x, gate_up, down, weights, ids), RMS, 0.0)
    for i in (0, 7):
        alone = quant_moe_experts(
            x[i : i + 1], gate_up, down, weights[i : i + 1], ids[i : i + 1], version="v2"
        )
        assert torch.equal(alone[0], full[i]), f"v2 token {i}: alone differs from the batch"


def _shared_inputs(tokens: int, hidden: int, dtype: torch.dtype, device: str) -> tuple[torch.Tensor, ...]:
    """(x, shared expert output, gate score [1, H]) in ``dtype``, the score ~H^-0.5 (gates spread over (0, 1))."""
    x = torch.randn(tokens, hidden, device=device).to(dtype)
    shared = (torch.randn(tokens, hidden, device=device) * 0.5).to(dtype)
    score = (torch.randn(1, hidden, device=device) * hidden**-0.5).to(dtype)
    return x, shared, score


@pytest.mark.parametrize("version", ["v1", "v2"])
def test_shared_term_in_the_down_kernel(version, device, assert_close):
    """The shared expert's term inside the down kernel (no add launch), v1 on E 8, H 128, I 96, top_k 2, v2 on
    odd geometry A (top_k 3, masked row tiles), T = 3: in fp32, ``shared`` as given is bitwise the routed sum plus
    ``shared`` (the separate add it replaces: one fp32 addition either way) and the gated term matches the
    reference to fp32 sums; in bf16 (one rounding, where the separate add rounded the routed sum first) the
    gated term matches the reference to ``RMS``; and rows alone are bitwise those rows of the batch."""
    shape = dict(e=E, h=H, inter=96) if version == "v1" else ODD_A
    top_k = TOP_K if version == "v1" else ODD_TOP_K
    gate_up, down, _, _ = make_experts(Q4, Q5, device, **shape)
    weights, ids = _route(3, shape["e"], top_k, device)
    x, shared, score = _shared_inputs(3, shape["h"], torch.float32, device)
    routed = quant_moe_experts(x, gate_up, down, weights, ids, version=version)
    added = quant_moe_experts(x, gate_up, down, weights, ids, shared, version=version)
    assert torch.equal(added, routed + shared), f"{version}: the fused add differs from the separate add"
    gated = quant_moe_experts(x, gate_up, down, weights, ids, shared, score, version=version)
    expected = quant_moe_experts_ref(x, gate_up, down, weights, ids, shared, score)
    assert_close(f"{version} gated fp32", gated, expected, 1e-5, 0.0)
    x, shared, score = (t.bfloat16() for t in (x, shared, score))
    gated = quant_moe_experts(x, gate_up, down, weights, ids, shared, score, version=version)
    assert gated.dtype == torch.bfloat16
    expected = quant_moe_experts_ref(x, gate_up, down, weights, ids, shared, score)
    assert_close(f"{version} gated bf16", gated, expected, RMS, 0.0)
    for i in (0, 2):
        alone = quant_moe_experts(x[i : i + 1], gate_up, down, weights[i : i + 1], ids[i : i + 1],
                                  shared[i : i + 1], score, version=version)  # fmt: skip
        assert torch.equal(alone[0], gated[i]), f"{version} token {i}: alone differs from the batch"


def _random_stack(fmt: str, rows: int, k: int, device: str) -> QuantWeight:
    """A random ``fmt`` [rows, k] stack built on the device (the CPU encoder would take minutes at the real size):
    random code and high bytes (k a multiple of 128: no padding lanes), scales giving weights of ~k^-0.5."""
    geo = geometry(fmt, (rows, k))
    assert geo.k_pad == k, "padding lanes would need zero codes"
    payload = torch.randint(0, 256, (geo.payload_bytes,), dtype=torch.uint8, device=device)
    scales = (torch.rand(rows * geo.groups_per_row, device=device) + 0.5) * k**-0.5 / GROUP_FORMATS[fmt].qmax
    payload[geo.scales_offset :] = scales.half().view(torch.uint8)
    return view_planes(fmt, payload, (rows, k))


@pytest.mark.skipif(INTERPRET, reason="the real geometry is for the GPU (minutes under the interpreter)")
@pytest.mark.parametrize("down_fmt", [Q5, Q6])
def test_real_geometry(down_fmt, device, assert_close):
    """35B-A3B: E 256, H 2048, I 512, top_k 8, gate_up Q4, down Q5 / Q6, T = 1 and 8: v1 and v2 against the
    reference, and v2's rows of T = 8 bitwise alone."""
    gate_up = _random_stack(Q4, 256 * 1024, 2048, device)
    down = _random_stack(down_fmt, 256 * 2048, 512, device)
    for tokens in (1, 8):
        x = torch.randn(tokens, 2048, device=device).bfloat16()
        weights, ids = _route(tokens, 256, 8, device)
        expected = quant_moe_experts_ref(x, gate_up, down, weights, ids)
        for version in ("v1", "v2"):
            got = quant_moe_experts(x, gate_up, down, weights, ids, version=version)
            assert_close(f"35B-A3B Q4/{down_fmt} {version} T={tokens}", got, expected, RMS, 0.0)
    v2 = quant_moe_experts(x, gate_up, down, weights, ids, version="v2")
    for i in range(8):
        alone = quant_moe_experts(
            x[i : i + 1], gate_up, down, weights[i : i + 1], ids[i : i + 1], version="v2"
        )
        assert torch.equal(alone[0], v2[i]), f"35B-A3B v2 token {i}: alone differs from the batch"


@pytest.mark.skipif(INTERPRET, reason="the real geometry is for the GPU (minutes under the interpreter)")
def test_real_geometry_shared_term(device, assert_close):
    """35B-A3B (gate_up Q4, down Q5), T = 1 and 8, the model's decode call: the shared expert's output and its gate
    (``shared_gate``) in the launches; v1 and v2 against the reference, and v2's rows of T = 8 bitwise alone."""
    gate_up = _random_stack(Q4, 256 * 1024, 2048, device)
    down = _random_stack(Q5, 256 * 2048, 512, device)
    for tokens in (1, 8):
        x, shared, score = _shared_inputs(tokens, 2048, torch.bfloat16, device)
        weights, ids = _route(tokens, 256, 8, device)
        expected = quant_moe_experts_ref(x, gate_up, down, weights, ids, shared, score)
        for version in ("v1", "v2"):
            got = quant_moe_experts(x, gate_up, down, weights, ids, shared, score, version=version)
            assert_close(f"35B-A3B shared {version} T={tokens}", got, expected, RMS, 0.0)
    for version in ("v1", "v2"):
        full = quant_moe_experts(x, gate_up, down, weights, ids, shared, score, version=version)
        for i in (0, 7):
            alone = quant_moe_experts(x[i : i + 1], gate_up, down, weights[i : i + 1], ids[i : i + 1],
                                      shared[i : i + 1], score, version=version)  # fmt: skip
            assert torch.equal(alone[0], full[i]), f"35B-A3B shared {version} token {i}: alone differs"


def test_switch_picks_the_kernels(monkeypatch, device):
    """``version=None`` follows ``NINFER_QUANT_MOE`` (``kernels._dispatch.QUANT_MOE_MODE``, read at every call)."""
    gate_up, down, _, _ = make_experts(Q4, Q5, device)
    x = torch.randn(1, H, device=device).bfloat16()
    weights, ids = _route(1, E, TOP_K, device)
    launched = []
    monkeypatch.setattr(quant_moe, "_launch_v2", lambda *args: launched.append("v2"))
    monkeypatch.setattr(_dispatch, "QUANT_MOE_MODE", "v2")
    quant_moe_experts(x, gate_up, down, weights, ids)
    assert launched == ["v2"]
    monkeypatch.setattr(_dispatch, "QUANT_MOE_MODE", "v1")
    quant_moe_experts(x, gate_up, down, weights, ids)
    assert launched == ["v2"], "v1 ran v2's launcher"
