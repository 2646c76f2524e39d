"""The routed experts of a MoE block on groupwise-quantized weights (the 35B-A3B ``groupwise-int`` profile:
gate_up Q4, down Q5, Q6 in layers 34, 38, 39): reference and decode launcher.

The profile stores each layer's experts as two rank-2 row-split weights, expert-major: gate_up ``[E * 2I, H]``
(expert e's gate rows ``[e * 2I, e * 2I + I)``, then its up rows) and down ``[E * H, I]`` (expert e's rows
``[e * H, (e + 1) * H)``). ``quant_moe_experts_ref`` is ``kernels.moe.moe_experts_ref`` on the exactly
dequantized weights. ``quant_moe_experts`` (few tokens: decode, MTP verify) runs two Triton kernels
(``triton_group.py``) shaped like ``kernels.moe``'s: ``_quant_moe_gate_up_kernel``, grid ``(T * top_k,
cdiv(I, BLOCK_N))``, dequantizes the pair's expert's gate and up rows in registers group by group and stores
``act = w * silu(gate) * up`` in fp32; ``_quant_moe_down_kernel``, grid ``(T, cdiv(H, BLOCK_H))``, sums the
token's top_k experts' down rows against their act in a fixed order and rounds once. No gather copy, no host
sync, per-token programs (batch invariant), CUDA-graph safe. ``NINFER_QUANT_MOE=v2`` (``kernels._dispatch``)
runs ``triton_moe.py``'s two kernels instead: the same grids with ~8x the programs a token and whole-chunk tiles
(tiles: ``quant_moe_tiles_v2``), the same contract, not bitwise v1. Prefill (``engine/model/quant_experts.py``)
dequantizes a layer's two stacks one after the other into one dense scratch (``quant_linear.dequantize_to``) and
runs the dense grouped expert path on it; under ``NINFER_MOE_PREFILL=quant`` it runs ``moe_prefill.py``'s grouped
GEMM on the quantized stacks instead.

The shared expert (its MLP run by the layer through ``quant_linear``, or bf16) joins inside the same two launches,
as in ``kernels.moe.moe_experts``: ``shared`` [T, H] (its output) is added by the down kernel in fp32 before the
one rounding, as given (already gated) or, with ``shared_gate`` (``shared_expert_gate``'s weight [1, H]), weighted
by ``sigmoid(shared_gate . x)``, which the token's first gate_up program computes (``kernels.moe``'s shared-slot
weight: fp32, a fixed order) and stores in a [T] fp32 buffer. No GEMV, sigmoid, product or add launch of its own.
Against the separate ops it replaces (a bf16 GEMV for the gate, then sigmoid, product and add each rounded to
bf16) the output differs by those roundings (within ``RMS`` of the reference in the kernel tests); in fp32 the
ungated add is bitwise the separate add. Batch invariant: a token's gate and term are read by its own programs.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels import _dispatch
from kernels._dispatch import HAS_TRITON, use_triton
from kernels.moe import moe_experts_ref
from kernels.pdl import pdl_args
from kernels.quant.formats import GROUP_FORMATS
from kernels.quant.weight import QuantWeight, dequantize

if HAS_TRITON:
    import triton

    from kernels.quant.triton_group import _quant_moe_down_kernel, _quant_moe_gate_up_kernel
    from kernels.quant.triton_moe import _quant_moe_down_v2_kernel, _quant_moe_gate_up_v2_kernel


def _geometry(x: torch.Tensor, gate_up: QuantWeight, down: QuantWeight) -> tuple[int, int, int]:
    hidden = x.shape[1]
    inter = down.shape[1]
    num_experts = down.shape[0] // hidden
    assert gate_up.shape == (num_experts * 2 * inter, hidden), (
        f"gate_up {gate_up.shape} is not [E * 2I, H] = [{num_experts * 2 * inter}, {hidden}]"
    )
    assert down.shape == (num_experts * hidden, inter), f"down {down.shape} is not [E * H, I]"
    return num_experts, hidden, inter


def quant_moe_experts_ref(
    x: torch.Tensor,
    gate_up: QuantWeight,
    down: QuantWeight,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
) -> torch.Tensor:
    """``sum_k weights[t, k] * expert_{ids[t, k]}(x[t])`` (``kernels.moe.moe_experts_ref``) with the experts'
    exactly dequantized weights, plus the shared expert's term: ``shared[t]`` (already gated), or
    ``sigmoid(shared_gate . x[t]) * shared[t]`` when ``shared_gate`` is given; all in fp32, rounded once.

    x: [T, H]; gate_up: [E * 2I, H]; down: [E * H, I] (stacked expert-major); weights, expert_ids: [T, top_k];
    shared: [T, H] (the shared expert's output) or None; shared_gate: [1, H] (``shared_expert_gate``'s weight)
    or None -> [T, H] (x's dtype).
    """
    num_experts, hidden, inter = _geometry(x, gate_up, down)
    assert shared is not None or shared_gate is None, "a shared gate without a shared expert output"
    gu = dequantize(gate_up).view(num_experts, 2 * inter, hidden)
    dn = dequantize(down).view(num_experts, hidden, inter)
    out = moe_experts_ref(x.float(), gu, dn, weights, expert_ids)  # fp32 in: the sum unrounded
    if shared is not None:
        term = shared.float()
        if shared_gate is not None:
            term = torch.sigmoid(x.float() @ shared_gate.float().t()) * term
        out = out + term
    return out.to(x.dtype)


class QuantMoeTiles(NamedTuple):
    block_n: int  # gate/up rows a (token, slot) program
    block_h: int  # output rows a token's down program
    num_warps: int
    num_stages: int


def quant_moe_tiles(hidden: int, inter: int) -> QuantMoeTiles:
    """32 gate/up rows a program (I = 512: 16 row tiles a pair), 16 output rows a down program (H = 2048: 128
    programs a token), 4 warps; a function of the geometry only (never of T). Not yet timed."""
    del hidden, inter
    return QuantMoeTiles(32, 16, 4, 3)


class QuantMoeTilesV2(NamedTuple):
    block_n: int  # gate/up rows (of I) a (token, slot) program: 2 * block_n rows a tile
    block_k_gate_up: int  # lanes of H a gate_up chunk (a power of 2 dividing K_pad; the chunks are unrolled)
    block_h: int  # output rows a token's down program (against all top_k experts at once)
    block_k_down: int  # lanes of I a down chunk
    warps_gate_up: int
    warps_down: int


# Alternatives to time on a GPU (``bench/kernels/quant.py --moe-only``): overrides of ``quant_moe_tiles_v2``'s
# arguments, each changing one kernel. sm_90 registers, Q4 gate_up / Q5 down, no spills (bench/kernels/aot_compile.py):
# gate_up default 119, n4 64, n16 213, gu_k1024 157, gu_whole_n4 153; down default 125, h4 127, h16 242, dn_whole
# 170, dn_whole_h4 164.
QUANT_MOE_V2_VARIANTS: dict[str, dict[str, int]] = {
    "default": {},
    "n4": dict(block_n=4),  # 1024 gate_up programs a token
    "n16": dict(block_n=16),  # 256
    "gu_k1024": dict(cap_gate_up=1024),  # 2 chunks
    "gu_whole_n4": dict(block_n=4, cap_gate_up=2048),  # one chunk: every load at once, 1024 programs
    "h4": dict(block_h=4, warps_down=4),  # 512 down programs a token
    "h16": dict(block_h=16),  # 128 (v1's count, all experts at once)
    "dn_whole": dict(cap_down=512),  # one chunk of I
    "dn_whole_h4": dict(block_h=4, cap_down=512, warps_down=4),
    "narrow": dict(cap_gate_up=128, cap_down=128),  # 16 and 4 chunks
}


def _chunk(k_pad: int, cap: int) -> int:
    """The largest power of two <= cap that divides k_pad (a multiple of 128, so at least 128)."""
    block = cap
    while k_pad % block:
        block //= 2
    return block


def quant_moe_tiles_v2(
    gate_up_k_pad: int,
    down_k_pad: int,
    block_n: int = 8,
    block_h: int = 8,
    cap_gate_up: int = 512,
    cap_down: int = 256,
    warps_gate_up: int = 4,
    warps_down: int = 8,
) -> QuantMoeTilesV2:
    """v2's tiles: a function of the weights' geometry only (never of T). Defaults at the 35B-A3B geometry
    (H 2048, I 512, top_k 8): 8 gate/up row pairs a program (512 programs a token), 4 chunks of 512 lanes
    (16 rows x 256 code bytes = 4 KiB of Q4 codes a chunk), 4 warps; 8 output rows a down program (256 programs a
    token), 2 chunks of 256 lanes (8 rows x 8 experts x 128 code bytes = 8 KiB of codes a chunk), 8 warps. Chosen
    by registers (every program of a token resident at once on 132 SMs), not yet timed: the variants of
    ``QUANT_MOE_V2_VARIANTS`` are what the H200 run picks from."""
    return QuantMoeTilesV2(
        block_n, _chunk(gate_up_k_pad, cap_gate_up), block_h, _chunk(down_k_pad, cap_down), warps_gate_up,
        warps_down,
    )  # fmt: skip


def quant_moe_experts(
    x: torch.Tensor,
    gate_up: QuantWeight,
    down: QuantWeight,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: torch.Tensor | None = None,
    shared_gate: torch.Tensor | None = None,
    version: str | None = None,
    tiles_v2: QuantMoeTilesV2 | None = None,
) -> torch.Tensor:
    """Launcher for ``quant_moe_experts_ref`` (same contract) on groupwise formats, for few tokens: the two
    Triton kernels where Triton runs (see the module docstring), the reference elsewhere. ``shared`` /
    ``shared_gate``: the shared expert's term, added in the down kernel (the gate computed in the gate_up
    kernel); ``version``: ``v1`` or ``v2`` (None: ``NINFER_QUANT_MOE``); ``tiles_v2``: v2's tiles (None:
    ``quant_moe_tiles_v2``'s defaults)."""
    num_experts, hidden, inter = _geometry(x, gate_up, down)
    grouped = gate_up.format in GROUP_FORMATS and down.format in GROUP_FORMATS
    if not grouped or not use_triton(x, gate_up.codes, down.codes, weights, expert_ids, shared, shared_gate):
        return quant_moe_experts_ref(x, gate_up, down, weights, expert_ids, shared, shared_gate)
    if gate_up.gemv_layout or down.gemv_layout:
        raise ValueError(
            "quant_moe_experts reads the stored row-split layout: load the expert stacks with "
            "view_planes(..., repack=False)"
        )
    num_tokens, top_k = expert_ids.shape
    assert weights.shape == expert_ids.shape == (x.shape[0], top_k), (
        f"weights {tuple(weights.shape)}, expert_ids {tuple(expert_ids.shape)} for {x.shape[0]} tokens"
    )
    tiles = quant_moe_tiles(hidden, inter)
    x = x if x.stride(1) == 1 else x.contiguous()
    weights, expert_ids = weights.contiguous(), expert_ids.contiguous()
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    term = _SharedTerm.of(x, shared, shared_gate)
    version = version or _dispatch.QUANT_MOE_MODE
    if version == "v2":
        _launch_v2(x, gate_up, down, weights, expert_ids, term, out, tiles_v2)
        return out
    act = torch.empty(num_tokens * top_k, inter, dtype=torch.float32, device=x.device)
    assert version == "v1", f"quant_moe_experts: version {version!r}, expected 'v1' or 'v2'"
    gu_spec, dn_spec = GROUP_FORMATS[gate_up.format], GROUP_FORMATS[down.format]
    gu_high = gate_up.high if gate_up.high is not None else gate_up.codes
    _quant_moe_gate_up_kernel[(num_tokens * top_k, triton.cdiv(inter, tiles.block_n))](
        x, gate_up.codes, gu_high, gate_up.scales, expert_ids, weights, act, term.score, term.gate, x.stride(0),
        gate_up.codes.stride(0), gu_high.stride(0), gate_up.scales.stride(0), HIDDEN=hidden, INTER=inter,
        TOP_K=top_k, BITS=gu_spec.bits, GROUP=gu_spec.group_size, GROUPS=gate_up.k_pad // gu_spec.group_size,
        BLOCK_N=tiles.block_n, NUM_STAGES=tiles.num_stages, SHARED_GATE=term.mode == 2,
        num_warps=tiles.num_warps, **pdl_args(x.device),
    )  # fmt: skip
    dn_high = down.high if down.high is not None else down.codes
    _quant_moe_down_kernel[(num_tokens, triton.cdiv(hidden, tiles.block_h))](
        act, down.codes, dn_high, down.scales, expert_ids, out, term.shared, term.gate, down.codes.stride(0),
        dn_high.stride(0), down.scales.stride(0), term.shared.stride(0), HIDDEN=hidden, INTER=inter, TOP_K=top_k,
        BITS=dn_spec.bits, GROUP=dn_spec.group_size, GROUPS=down.k_pad // dn_spec.group_size,
        BLOCK_H=tiles.block_h, SHARED=term.mode, num_warps=tiles.num_warps, **pdl_args(x.device),
    )  # fmt: skip
    return out


class _SharedTerm(NamedTuple):
    """The shared expert's term as the kernels take it: ``mode`` 0 (none), 1 (``shared`` added as given) or 2
    (weighted by the gate ``sigmoid(score . x)``, which the gate_up kernel stores into ``gate`` [T] fp32 and the
    down kernel reads). Pointers a mode does not read are stand-ins (never read)."""

    mode: int
    shared: torch.Tensor  # [T, H], unit stride along H
    score: torch.Tensor  # [1, H] (``shared_expert_gate``'s weight), unit stride
    gate: torch.Tensor  # [T] fp32

    @staticmethod
    def of(x: torch.Tensor, shared: torch.Tensor | None, shared_gate: torch.Tensor | None) -> _SharedTerm:
        num_tokens, hidden = x.shape
        if shared is None:
            assert shared_gate is None, "a shared gate without a shared expert output"
            return _SharedTerm(0, x, x, x)
        assert shared.shape == (num_tokens, hidden), (
            f"shared {tuple(shared.shape)} for {(num_tokens, hidden)}"
        )
        shared = shared if shared.stride(1) == 1 else shared.contiguous()
        if shared_gate is None:
            return _SharedTerm(1, shared, x, x)
        assert shared_gate.shape == (1, hidden), (
            f"shared_gate {tuple(shared_gate.shape)}: expected [1, {hidden}]"
        )
        score = shared_gate if shared_gate.stride(1) == 1 else shared_gate.contiguous()
        gate = torch.empty(num_tokens, dtype=torch.float32, device=x.device)
        return _SharedTerm(2, shared, score, gate)


def _launch_v2(
    x: torch.Tensor,
    gate_up: QuantWeight,
    down: QuantWeight,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    term: _SharedTerm,
    out: torch.Tensor,
    tiles: QuantMoeTilesV2 | None,
) -> None:
    """``triton_moe.py``'s two kernels (grids in its docstring) into ``out``, through act ``[T * top_k, I]`` fp32
    (rows padded to an even length: the down kernel reads lane pairs as 8-byte words)."""
    num_tokens, top_k = expert_ids.shape
    hidden, inter = x.shape[1], down.shape[1]
    act_stride = inter + inter % 2
    act = torch.empty(num_tokens * top_k, act_stride, dtype=torch.float32, device=x.device)
    # bf16 x with 4-byte aligned rows is read as int32 lane pairs
    x_pairs = x.dtype == torch.bfloat16 and x.stride(0) % 2 == 0 and x.data_ptr() % 4 == 0
    tiles = tiles or quant_moe_tiles_v2(gate_up.k_pad, down.k_pad)
    gu_spec, dn_spec = GROUP_FORMATS[gate_up.format], GROUP_FORMATS[down.format]
    assert gate_up.k_pad % tiles.block_k_gate_up == 0 and down.k_pad % tiles.block_k_down == 0, tiles
    gu_high = gate_up.high if gate_up.high is not None else gate_up.codes
    _quant_moe_gate_up_v2_kernel[(num_tokens * top_k, triton.cdiv(inter, tiles.block_n))](
        x, gate_up.codes, gu_high, gate_up.scales, expert_ids, weights, act, term.score, term.gate, x.stride(0),
        gate_up.codes.stride(0), gu_high.stride(0), gate_up.scales.stride(0), HIDDEN=hidden, INTER=inter,
        ACT_STRIDE=act_stride, TOP_K=top_k, BITS=gu_spec.bits, GROUP=gu_spec.group_size, K_PAD=gate_up.k_pad,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k_gate_up, X_PAIRS=x_pairs, SHARED_GATE=term.mode == 2,
        num_warps=tiles.warps_gate_up, **pdl_args(x.device),
    )  # fmt: skip
    dn_high = down.high if down.high is not None else down.codes
    _quant_moe_down_v2_kernel[(num_tokens, triton.cdiv(hidden, tiles.block_h))](
        act, down.codes, dn_high, down.scales, expert_ids, out, term.shared, term.gate, down.codes.stride(0),
        dn_high.stride(0), down.scales.stride(0), term.shared.stride(0), HIDDEN=hidden, INTER=inter,
        ACT_STRIDE=act_stride, TOP_K=top_k, BLOCK_TOPK=triton.next_power_of_2(top_k), BITS=dn_spec.bits,
        GROUP=dn_spec.group_size, K_PAD=down.k_pad, BLOCK_H=tiles.block_h, BLOCK_K=tiles.block_k_down,
        SHARED=term.mode, num_warps=tiles.warps_down, **pdl_args(x.device),
    )  # fmt: skip
