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
sync, per-token programs (batch invariant), CUDA-graph safe. The shared expert is not part of this launch: the
layer runs it through ``quant_linear`` (or bf16) and adds it. Prefill (``engine/model/quant_experts.py``)
dequantizes a layer's two stacks into one dense scratch (``quant_linear.dequantize_to``) and runs the dense
grouped expert path on it.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kernels._dispatch import HAS_TRITON, use_triton
from kernels.moe import moe_experts_ref
from kernels.quant.formats import GROUP_FORMATS
from kernels.quant.weight import QuantWeight, dequantize

if HAS_TRITON:
    import triton

    from kernels.quant.triton_group import _quant_moe_down_kernel, _quant_moe_gate_up_kernel


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
    x: torch.Tensor, gate_up: QuantWeight, down: QuantWeight, weights: torch.Tensor, expert_ids: torch.Tensor
) -> torch.Tensor:
    """``sum_k weights[t, k] * expert_{ids[t, k]}(x[t])`` (``kernels.moe.moe_experts_ref``) with the experts'
    exactly dequantized weights, fp32, rounded once.

    x: [T, H]; gate_up: [E * 2I, H]; down: [E * H, I] (stacked expert-major); weights, expert_ids: [T, top_k]
    -> [T, H] (x's dtype).
    """
    num_experts, hidden, inter = _geometry(x, gate_up, down)
    gu = dequantize(gate_up).view(num_experts, 2 * inter, hidden)
    dn = dequantize(down).view(num_experts, hidden, inter)
    return moe_experts_ref(x, gu, dn, weights, expert_ids)


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


def quant_moe_experts(
    x: torch.Tensor, gate_up: QuantWeight, down: QuantWeight, weights: torch.Tensor, expert_ids: torch.Tensor
) -> torch.Tensor:
    """Launcher for ``quant_moe_experts_ref`` (same contract) on groupwise formats, for few tokens: the two
    Triton kernels where Triton runs (see the module docstring), the reference elsewhere."""
    num_experts, hidden, inter = _geometry(x, gate_up, down)
    grouped = gate_up.format in GROUP_FORMATS and down.format in GROUP_FORMATS
    if not grouped or not use_triton(x, gate_up.codes, down.codes, weights, expert_ids):
        return quant_moe_experts_ref(x, gate_up, down, weights, expert_ids)
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
    act = torch.empty(num_tokens * top_k, inter, dtype=torch.float32, device=x.device)
    gu_spec, dn_spec = GROUP_FORMATS[gate_up.format], GROUP_FORMATS[down.format]
    gu_high = gate_up.high if gate_up.high is not None else gate_up.codes
    _quant_moe_gate_up_kernel[(num_tokens * top_k, triton.cdiv(inter, tiles.block_n))](
        x, gate_up.codes, gu_high, gate_up.scales, expert_ids, weights, act, x.stride(0), gate_up.codes.stride(0),
        gu_high.stride(0), gate_up.scales.stride(0), HIDDEN=hidden, INTER=inter, TOP_K=top_k, BITS=gu_spec.bits,
        GROUP=gu_spec.group_size, GROUPS=gate_up.k_pad // gu_spec.group_size, BLOCK_N=tiles.block_n,
        NUM_STAGES=tiles.num_stages, num_warps=tiles.num_warps,
    )  # fmt: skip
    dn_high = down.high if down.high is not None else down.codes
    _quant_moe_down_kernel[(num_tokens, triton.cdiv(hidden, tiles.block_h))](
        act, down.codes, dn_high, down.scales, expert_ids, out, down.codes.stride(0), dn_high.stride(0),
        down.scales.stride(0), HIDDEN=hidden, INTER=inter, TOP_K=top_k, BITS=dn_spec.bits,
        GROUP=dn_spec.group_size, GROUPS=down.k_pad // dn_spec.group_size, BLOCK_H=tiles.block_h,
        num_warps=tiles.num_warps,
    )  # fmt: skip
    return out
