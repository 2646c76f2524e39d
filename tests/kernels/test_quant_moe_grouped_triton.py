"""The Triton grouped GEMM of the quantized routed experts (``kernels/quant/triton_moe_grouped.py``, prefill under
``NINFER_MOE_PREFILL=quant``) vs ``quant_moe_grouped_ref``: Q4/Q5/Q6 stacks at E 8-16, H 256, I 128, top_k 2-4;
routings with empty experts, one expert taking every token's first slot, T not a multiple of the M tile (padding
rows in every group, tiles that end past their group), several M tiles an expert (BLOCK_M 16), the shared term,
odd H and I (padded K, masked weight rows), the tile variants;
fp16 and bf16; and that the grid's programs past the last tile leave the unused rows alone (GPU; or CPU under TRITON_INTERPRET=1).
"""

from __future__ import annotations

import pytest
import torch
from test_quant_moe import make_experts

from engine.model.mlp import expert_groups
from kernels._dispatch import INTERPRET
from kernels.moe import moe_route_ref
from kernels.quant import Q4, Q5, Q6
from kernels.quant.moe_prefill import (
    QUANT_MOE_GROUPED_VARIANTS,
    quant_moe_grouped,
    quant_moe_grouped_ref,
    quant_moe_grouped_tiles,
)

pytestmark = [pytest.mark.gpu, pytest.mark.usefixtures("interpreter_fixes")]

H, INTER = 256, 128
# rel RMS against the reference: fp32 sums in another order and the roundings of the weight, act and each expert's
# output to x's dtype (as the reference's); fp16 rounds to nearest everywhere, bf16 under the interpreter truncates
# (three systematic truncations: ~1.8e-2 measured), on the GPU it rounds
RMS = {torch.float16: 5e-4, torch.bfloat16: 2.5e-2 if INTERPRET else 6e-3}


def _routing(kind: str, tokens: int, experts: int, top_k: int, device: str):
    weights, ids = moe_route_ref(torch.randn(tokens, experts), top_k)
    if kind == "sparse":  # only experts 1, 4 and the last: the others' groups are empty
        allowed = torch.tensor([1, 4, experts - 1])
        ids = torch.stack([allowed[torch.randperm(3)[:top_k]] for _ in range(tokens)])
    elif kind == "one":  # every token's first slot is expert 3: one group of T rows
        others = torch.tensor([e for e in range(experts) if e != 3])
        rest = torch.stack([others[torch.randperm(experts - 1)[: top_k - 1]] for _ in range(tokens)])
        ids = torch.cat([torch.full((tokens, 1), 3), rest], dim=1)
    return weights.to(device), ids.to(device)


def _check(gu, dn, experts, top_k, tokens, kind, device, assert_close, block_m=None, shared=False, dtype=None,
           variant="default", h=H, inter=INTER):  # fmt: skip
    dtype = dtype or torch.float16
    gate_up, down, _, _ = make_experts(gu, dn, device, e=experts, h=h, inter=inter)
    x = torch.randn(tokens, h, device=device).to(dtype)
    weights, ids = _routing(kind, tokens, experts, top_k, device)
    term = (torch.randn(tokens, h, device=device) * 0.5).to(dtype) if shared else None
    tiles = quant_moe_grouped_tiles(tokens * top_k, experts)._replace(**QUANT_MOE_GROUPED_VARIANTS[variant])
    if block_m is not None:
        tiles = tiles._replace(block_m=block_m)
    groups = expert_groups(ids, experts)
    got = quant_moe_grouped(x, gate_up, down, weights, ids, groups, term, tiles=tiles)
    assert got.dtype == x.dtype and got.shape == x.shape
    expected = quant_moe_grouped_ref(x, gate_up, down, weights, ids, term)
    assert expected.float().abs().mean() > 0
    name = f"{gu}/{dn} E{experts} H{h} I{inter} k{top_k} T{tokens} {kind} {variant} M{tiles.block_m} {dtype}"
    assert_close(name, got, expected, RMS[dtype], 0.0)


@pytest.mark.parametrize(
    ("gu", "dn", "experts", "top_k", "tokens", "kind", "block_m"),
    [
        (Q4, Q5, 8, 2, 37, "random", None),  # T not a multiple of 16: a padded tail in most groups
        (Q4, Q6, 16, 4, 24, "random", None),  # 96 pairs over 16 experts: BLOCK_M 16, some groups empty
        (Q5, Q6, 8, 2, 21, "sparse", None),  # 5 of 8 groups empty
        (Q4, Q5, 8, 3, 45, "one", 16),  # expert 3: 45 rows in 3 tiles, the last one partial (48 padded)
        (
            Q6,
            Q4,
            8,
            2,
            70,
            "random",
            32,
        ),  # tiles of 32 over groups of 16-multiples: tiles ending past a group
    ],
)
def test_matches_reference(gu, dn, experts, top_k, tokens, kind, block_m, device, assert_close):
    _check(gu, dn, experts, top_k, tokens, kind, device, assert_close, block_m)


def test_shared_term_and_one_token(device, assert_close):
    """The gated shared expert's output joins in ``moe_combine``; T = 1 (every group padded from one row)."""
    _check(Q4, Q5, 8, 2, 1, "random", device, assert_close, shared=True)
    _check(Q4, Q6, 8, 4, 19, "one", device, assert_close, block_m=64, shared=True)


@pytest.mark.parametrize(("gu", "dn"), [(Q4, Q5), (Q4, Q6)])
def test_bf16(gu, dn, device, assert_close):
    """The model's dtype (the other cases run fp16, which the interpreter rounds as the GPU does)."""
    _check(gu, dn, 8, 2, 37, "random", device, assert_close, shared=True, dtype=torch.bfloat16)


@pytest.mark.parametrize("variant", [v for v in QUANT_MOE_GROUPED_VARIANTS if v != "default"])
def test_tile_variants_match_reference(variant, device, assert_close):
    """The tile alternatives the H200 run times (``QUANT_MOE_GROUPED_VARIANTS``: 64-row M tiles, 128 gate/up rows,
    K steps of two groups, 4 stages) compute the same function (Q5 gate_up: high planes at a 128-lane step)."""
    _check(Q5, Q6, 8, 3, 29, "random", device, assert_close, variant=variant)


@pytest.mark.parametrize(("h", "inter"), [(132, 40), (72, 136)])
def test_odd_geometry(h, inter, device, assert_close):
    """K not a multiple of 128 (H 132 / 72 -> K_pad 256 / 128, I 136 -> 256: padded lanes masked in x / act, zero
    codes in the weights) and N not a multiple of the row tiles (I 40 of 64 gate rows, H 132 of 128 output rows)."""
    _check(Q4, Q5, 5, 3, 23, "random", device, assert_close, shared=True, h=h, inter=inter)


def test_no_tokens(device):
    gate_up, down, _, _ = make_experts(Q4, Q5, device, e=8, h=H, inter=INTER)
    x = torch.empty(0, H, device=device).bfloat16()
    ids = torch.empty(0, 2, dtype=torch.int64, device=device)
    weights = torch.empty(0, 2, device=device)
    out = quant_moe_grouped(x, gate_up, down, weights, ids, expert_groups(ids, 8))
    assert out.shape == (0, H)


def test_programs_past_the_last_tile_write_nothing(device, monkeypatch):
    """The grid over-covers (``tiles_bound``): the programs past the last tile exit and a tile's rows past its
    group's end are masked, so the rows of the padded layout past ``offs[-1]`` keep what was there (NaN here)."""
    import kernels.quant.moe_prefill as qmg

    gate_up, down, _, _ = make_experts(Q4, Q5, device, e=8, h=H, inter=INTER)
    x = torch.randn(9, H, device=device).bfloat16()
    weights, ids = _routing("sparse", 9, 8, 2, device)
    groups = expert_groups(ids, 8)
    made = []
    empty = torch.empty

    def filled(*shape, **kw):
        t = empty(*shape, **kw).fill_(float("nan"))
        made.append(t)
        return t

    monkeypatch.setattr(qmg.torch, "empty", filled)
    out = quant_moe_grouped(x, gate_up, down, weights, ids, groups)
    monkeypatch.setattr(qmg.torch, "empty", empty)
    end = int(groups.offs[-1])
    act, expert_out = made[:2]
    assert end < act.shape[0]
    assert torch.isnan(act[end:].float()).all() and torch.isnan(expert_out[end:].float()).all()
    assert not torch.isnan(act[:end].float()).any() and not torch.isnan(out.float()).any()


def _random_stack(fmt: str, n: int, k: int, device: str):
    """A valid random [n, k] stack of ``fmt`` built on the device (no encoder pass: K a multiple of 128, so no
    padding lanes): random code and high bytes, fp16 scales giving weights of magnitude ~k^-0.5."""
    from kernels.quant import GROUP_FORMATS, geometry, view_planes

    geo, spec = geometry(fmt, (n, k)), GROUP_FORMATS[fmt]
    payload = torch.randint(0, 256, (geo.payload_bytes,), dtype=torch.uint8, device=device)
    scales = torch.rand(n * geo.groups_per_row, device=device) * 2 * k**-0.5 / spec.qmax
    payload[geo.scales_offset :] = scales.half().view(torch.uint8)
    return view_planes(fmt, payload, (n, k))


@pytest.mark.skipif(INTERPRET, reason="the real geometry: minutes under the interpreter")
@pytest.mark.parametrize(("dn", "tokens"), [(Q5, 128), (Q6, 1024), (Q5, 7680)])
def test_real_geometry_matches_the_scratch_path(dn, tokens, device, assert_close):
    """The 35B-A3B (E 256, H 2048, I 512, top_k 8; T = 128, 1024, 7680: BLOCK_M 16, 32, 128): against the
    reference, and against ``NINFER_MOE_PREFILL=scratch``'s math (the banks dequantized to bf16, the dense grouped
    path; it rounds gate and up to bf16 before the activation, the kernel does not)."""
    from engine.model.mlp import _experts_grouped
    from kernels.quant.quant_linear import dequantize_to

    experts, hidden, inter, top_k = 256, 2048, 512, 8
    gate_up = _random_stack(Q4, experts * 2 * inter, hidden, device)
    down = _random_stack(dn, experts * hidden, inter, device)
    x = torch.randn(tokens, hidden, device=device).bfloat16()
    shared = (torch.randn(tokens, hidden, device=device) * 0.1).bfloat16()
    weights, ids = moe_route_ref(torch.randn(tokens, experts, device=device), top_k)
    got = quant_moe_grouped(x, gate_up, down, weights, ids, expert_groups(ids, experts), shared)
    expected = quant_moe_grouped_ref(x, gate_up, down, weights, ids, shared)
    assert_close(f"35B-A3B Q4/{dn} T{tokens}", got, expected, RMS[torch.bfloat16], 0.0)
    gu = dequantize_to(gate_up, torch.bfloat16).view(experts, 2 * inter, hidden)
    dn_bank = dequantize_to(down, torch.bfloat16).view(experts, hidden, inter)
    scratch = _experts_grouped(x, gu, dn_bank, weights, ids, shared)
    assert_close(f"35B-A3B Q4/{dn} T{tokens} vs scratch", got, scratch, 1e-2, 0.0)
