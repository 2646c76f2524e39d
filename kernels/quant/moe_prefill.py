"""The groupwise-int routed experts for many tokens (prefill) without a dense copy of the banks: reference,
launcher and tiles of ``triton_moe_grouped.py``'s grouped GEMM (``NINFER_MOE_PREFILL=quant``,
``engine/model/quant_experts.py``).

``quant_moe_grouped_ref`` is the specification: the dense expert path's math on the stacks dequantized once to
x's dtype (what the scratch path hands to the grouped GEMMs): each chosen expert's gate and up in fp32, the
activation ``silu(gate) * up`` rounded to x's dtype, its down projection in fp32 rounded to x's dtype, the
weighted sum over the token's experts plus ``shared`` in fp32, rounded once. In fp32 (the CPU models) every
rounding but the last is exact and the operations are those of ``engine.model.mlp``'s CPU path
(``_experts_by_expert``: experts in ascending order, ``index_add_``), so the result is bitwise that path's on the
dequantized banks. The launcher runs it wherever the kernel does not (CPU, fp32 x, ``NINFER_KERNELS=ref``).

``quant_moe_grouped`` (CUDA, or Triton's interpreter; bf16 / fp16 x): two launches of the grouped GEMM over the
rows of an ``ExpertGroups`` (``engine.model.mlp.expert_groups``: ``(offs, token_idx, row_idx)``), gate_up with
the activation in its epilogue (fp32 gate and up, not rounded before it, unlike the dense path's
``silu_mul``), then down, then ``kernels.moe.moe_combine`` with ``shared``. Every grid size comes from T, top_k, E
and the tiles: no host sync, nothing allocated that depends on the routing.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels._dispatch import HAS_TRITON, use_triton
from kernels.moe import moe_combine
from kernels.quant.formats import GROUP_FORMATS
from kernels.quant.quant_moe import _geometry
from kernels.quant.weight import QuantWeight, dequantize

if HAS_TRITON:
    import triton

    from kernels.quant.triton_moe_grouped import _quant_moe_grouped_kernel


def quant_moe_grouped_ref(
    x: torch.Tensor,
    gate_up: QuantWeight,
    down: QuantWeight,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """The routed sum (plus ``shared``, already gated) on the stacks dequantized to x's dtype (module docstring).

    x: [T, H]; gate_up: [E * 2I, H]; down: [E * H, I] (stacked expert-major); weights, expert_ids: [T, top_k];
    shared: [T, H] or None -> [T, H] (x's dtype).
    """
    num_experts, hidden, inter = _geometry(x, gate_up, down)
    gu = dequantize(gate_up).to(x.dtype).view(num_experts, 2 * inter, hidden)
    dn = dequantize(down).to(x.dtype).view(num_experts, hidden, inter)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in expert_ids.unique().tolist():
        token_idx, k_idx = (expert_ids == expert).nonzero(as_tuple=True)
        gate, up = (x[token_idx].float() @ gu[expert].float().t()).chunk(2, dim=-1)
        act = (F.silu(gate) * up).to(x.dtype).float()
        ye = (act @ dn[expert].float().t()).to(x.dtype).float()
        out.index_add_(0, token_idx, ye * weights[token_idx, k_idx, None].float())
    if shared is not None:
        out = out + shared.float()
    return out.to(x.dtype)


class QuantMoeGroupedTiles(NamedTuple):
    block_m: int  # rows of an expert's group a program (the dot's N side; >= 16)
    block_n_gate_up: int  # gate (and as many up) weight rows a gate_up program
    block_n_down: int  # down weight rows (output columns) a down program
    block_k: int  # lanes a K step (a multiple of the format's group)
    num_warps: int
    num_stages: int


def quant_moe_grouped_tiles(pairs: int, num_experts: int) -> QuantMoeGroupedTiles:
    """The tiles for ``pairs`` (token, expert) rows over ``num_experts``: BLOCK_M the rows an expert gets on
    average, as a power of two in [16, 128] (35B-A3B: T = 128 -> 16 rows, 1024 -> 32, 7680 -> 128); 64 gate and 64
    up rows a gate_up program (one 128-row weight tile: 64 rows a warpgroup), 128 output rows a down program, K steps
    of 64 (one group), 8 warps, 3 stages. Chosen by registers (sm_90 AOT, no spills), not yet timed
    (``bench/kernels/quant.py --moe-prefill-only``)."""
    per_expert = -(-max(pairs, 1) // num_experts)
    block_m = min(128, max(16, 1 << (per_expert - 1).bit_length()))
    return QuantMoeGroupedTiles(block_m, 64, 128, 64, 8, 3)


# Alternatives to time on a GPU (``bench/kernels/quant.py --moe-prefill-only --moe-prefill-variants all``): overrides
# of ``quant_moe_grouped_tiles``' fields. AOT at the 35B-A3B, registers / shared memory on sm_90 (sm_120), no spills
# anywhere: default gate_up M128 135 / 64 KiB (170 / 48 KiB), M32 73 / 16 KiB, M16 59 / 10 KiB; down Q5 M128 128 /
# 52 KiB (162 / 48 KiB), Q6 M128 134; m64 gate_up 101 / 32 KiB, down 101 / 28 KiB; n128 gate_up M128 223 / 52 KiB
# (251), M32 121; k128 gate_up M128 181 / 104 KiB (178 / 96 KiB), down 202 / 104 KiB (255 / 96 KiB); s4 gate_up 135
# / 68 KiB, down 128 / 68 KiB. (4 warps at M128: 251-255 registers; not a variant.)
QUANT_MOE_GROUPED_VARIANTS: dict[str, dict[str, int]] = {
    "default": {},
    "m64": dict(block_m=64),  # at most 64 rows a tile whatever T
    "n128": dict(block_n_gate_up=128),  # 128 gate + 128 up rows a gate_up program: half the x tile reads
    "k128": dict(block_k=128),  # two groups a K step
    "s4": dict(num_stages=4),
}


def tiles_bound(rows: int, pairs: int, num_experts: int, block_m: int) -> int:
    """Programs along M enough for any routing: the padded layout's ``rows`` in BLOCK_M tiles, plus one partial
    tile for each group that can be non-empty (at most min(E, pairs))."""
    return -(-rows // block_m) + min(num_experts, pairs)


def quant_moe_grouped(
    x: torch.Tensor,
    gate_up: QuantWeight,
    down: QuantWeight,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    groups: tuple[torch.Tensor, torch.Tensor, torch.Tensor],
    shared: torch.Tensor | None = None,
    tiles: QuantMoeGroupedTiles | None = None,
) -> torch.Tensor:
    """Launcher for ``quant_moe_grouped_ref`` (same contract): the grouped GEMM of ``triton_moe_grouped.py`` where
    Triton runs and x is bf16 / fp16, the reference elsewhere. ``groups``: the routing's ``ExpertGroups`` (offs
    [E] int32, token_idx [rows] int64, row_idx [T, top_k] int64); ``tiles``: None for ``quant_moe_grouped_tiles``."""
    num_experts, hidden, inter = _geometry(x, gate_up, down)
    grouped = gate_up.format in GROUP_FORMATS and down.format in GROUP_FORMATS
    kernel_dtype = x.dtype in (torch.bfloat16, torch.float16)
    if not (
        grouped and kernel_dtype and use_triton(x, gate_up.codes, down.codes, weights, expert_ids, shared)
    ):
        return quant_moe_grouped_ref(x, gate_up, down, weights, expert_ids, shared)
    if gate_up.gemv_layout or down.gemv_layout:
        raise ValueError(
            "quant_moe_grouped reads the stored row-split layout (view_planes(..., repack=False))"
        )
    offs, token_idx, row_idx = groups
    num_tokens, top_k = expert_ids.shape
    assert offs.shape == (num_experts,) and row_idx.shape == (num_tokens, top_k), (
        f"groups: offs {tuple(offs.shape)}, row_idx {tuple(row_idx.shape)} for E {num_experts}, "
        f"routing {(num_tokens, top_k)}"
    )
    rows = token_idx.shape[0]
    x = x if x.stride(1) == 1 else x.contiguous()
    act = torch.empty(rows, inter, dtype=x.dtype, device=x.device)
    expert_out = torch.empty(rows, hidden, dtype=x.dtype, device=x.device)
    if num_tokens:
        tiles = tiles or quant_moe_grouped_tiles(num_tokens * top_k, num_experts)
        m_tiles = tiles_bound(rows, num_tokens * top_k, num_experts, tiles.block_m)
        offs, token_idx = offs.contiguous(), token_idx.contiguous()
        _launch(x, gate_up, offs, token_idx, act, inter, hidden, True, m_tiles, tiles)
        _launch(act, down, offs, token_idx, expert_out, hidden, inter, False, m_tiles, tiles)
    return moe_combine(expert_out, row_idx, weights, shared)


def _launch(
    a: torch.Tensor,
    w: QuantWeight,
    offs: torch.Tensor,
    token_idx: torch.Tensor,
    out: torch.Tensor,
    n: int,
    k: int,
    gate_up: bool,
    m_tiles: int,
    tiles: QuantMoeGroupedTiles,
) -> None:
    spec = GROUP_FORMATS[w.format]
    assert tiles.block_k % spec.group_size == 0 and w.k_pad % tiles.block_k == 0, (tiles, w.format, w.k_pad)
    block_n = tiles.block_n_gate_up if gate_up else tiles.block_n_down
    high = w.high if w.high is not None else w.codes
    _quant_moe_grouped_kernel[(m_tiles, triton.cdiv(n, block_n))](
        a, w.codes, high, w.scales, offs, token_idx, out, a.stride(0), w.codes.stride(0), high.stride(0),
        w.scales.stride(0), N=n, K=k, K_PAD=w.k_pad, NUM_EXPERTS=offs.shape[0], BITS=spec.bits,
        GROUP=spec.group_size, GATE_UP=gate_up, BLOCK_E=triton.next_power_of_2(offs.shape[0]),
        BLOCK_M=tiles.block_m, BLOCK_N=block_n, BLOCK_K=tiles.block_k, NUM_STAGES=tiles.num_stages,
        num_warps=tiles.num_warps,
    )  # fmt: skip
