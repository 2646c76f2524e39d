"""Mixture-of-experts: softmax top-k routing and the weighted expert sum (references, Triton kernels).

Routing (HF ``Qwen3_5MoeTopKRouter``): ``probs = softmax(router_logits)`` in fp32, keep the top-k
experts per token, then renormalise the kept probabilities to sum to one. Each expert is a SiLU-gated
MLP whose gate and up projections are stored fused, ``gate_up[e] = [gate; up]`` of shape ``[2I, H]``,
as in the real checkpoints (``mlp.experts.gate_up_proj [E, 2I, H]``, ``mlp.experts.down_proj [E, H, I]``).
The block's shared expert (``SharedExpert``: HF ``shared_expert.{gate,up,down}_proj`` and
``shared_expert_gate``, intermediate size ``I_s``, which may differ from ``I``) is added to the routed
sum with the weight ``sigmoid(shared_expert_gate . x)``: a ninth expert that every token picks.

Triton (few tokens: decode, MTP verify, small batches): ``moe_route`` is one program per token (softmax,
top-k, renormalise); ``moe_experts`` is two GEMV kernels that read each chosen expert's weights in place
(no gather copy), fp32 accumulate. A token has ``S = top_k`` slots, ``top_k + 1`` with the shared expert
(the last slot):

* ``_moe_gate_up_kernel``, grid ``(T * S, cdiv(max(I, I_s), BLOCK_N))``: ``act[t, s] = w[t, s] * silu(gate)
  * up`` for ``BLOCK_N`` rows of one (token, slot) pair, stored fp32 ([T, top_k * I + I_s]). A routed
  slot's w is its routing weight; the shared slot reads its gate and up rows from the shared expert's own
  two [I_s, H] tensors (no repacking) and computes its w = sigmoid(shared_expert_gate . x) itself.
* ``_moe_down_kernel``, grid ``(T, cdiv(H, BLOCK_H))``: ``out[t] = sum_k down[e_k] @ act[t, k]`` (+
  ``shared_down @ act[t, top_k]``) for ``BLOCK_H`` output rows of one token, all its slots in one
  program, in a fixed order: the routed experts' sum, then the shared expert (no atomics).

Triton (many tokens: prefill, where engine/model/mlp.py groups the pairs' rows by expert for two grouped
GEMMs): ``moe_combine``, ``_moe_combine_kernel``, grid ``(T, cdiv(H, BLOCK_H))``: ``out[t] = sum_k w[t, k] *
expert_out[rows[t, k]] (+ shared[t])``, one token's top_k expert-output rows of ``BLOCK_H`` columns loaded at
once ([BLOCK_TOPK, BLOCK_H]), weighted and summed in fp32, the shared expert's output added, rounded once; no
atomics, no fp32 scatter (each token gathers its own rows). Rows that no token names (the grouped buffer's
padding) are never read.

Batch invariance: every program works for one pair or one token only, T is not a kernel argument (only
the grid), and the tiles depend on the geometry (H, I, top_k, dtype), never on T: a token's output is
bitwise the same alone or in any batch. Pairs (tokens) are the fastest grid axis, so all pairs of one row
tile run together and pairs that share an expert read its rows at about the same time: the repeats are L2
hits, and HBM traffic is about one read per distinct chosen expert (no grouping pass, no sort). No host
sync and fixed shapes: the launch can be captured in a CUDA graph.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels._dispatch import HAS_TRITON, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl


def moe_route_ref(
    router_logits: torch.Tensor, top_k: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """router_logits: [T, E] -> (weights [T, top_k] fp32, expert_ids [T, top_k] int64), best first."""
    probs = router_logits.float().softmax(dim=-1)
    weights, expert_ids = probs.topk(top_k, dim=-1)
    if renormalize:
        weights = weights / weights.sum(dim=-1, keepdim=True)
    return weights, expert_ids


class SharedExpert(NamedTuple):
    """A MoE block's shared expert, the tensors as the model holds them (nothing repacked): HF
    ``shared_expert.{gate,up,down}_proj.weight`` and ``shared_expert_gate.weight``."""

    gate_proj: torch.Tensor  # [I_s, H]
    up_proj: torch.Tensor  # [I_s, H]
    down_proj: torch.Tensor  # [H, I_s]
    gate: torch.Tensor  # [1, H]: the expert's output is scaled by sigmoid(gate . x)


def moe_experts_ref(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: SharedExpert | None = None,
) -> torch.Tensor:
    """``sum_k weights[t, k] * expert_{ids[t, k]}(x[t])`` with ``expert_e(x) = down_e(silu(gate_e x) * up_e x)``,
    plus ``sigmoid(shared.gate . x[t]) * shared(x[t])`` when ``shared`` is given (HF
    ``Qwen3_5MoeSparseMoeBlock``'s output), all in fp32 and rounded once (the model's CPU path rounds each
    op to the model dtype instead).

    x: [T, H]; gate_up: [E, 2I, H]; down: [E, H, I]; weights, expert_ids: [T, top_k]; shared: see
    ``SharedExpert`` -> [T, H] (x.dtype).
    """
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for expert in expert_ids.unique().tolist():
        token_idx, k_idx = (expert_ids == expert).nonzero(as_tuple=True)
        xe = x[token_idx].float()
        gate, up = (xe @ gate_up[expert].float().t()).chunk(2, dim=-1)
        ye = (F.silu(gate) * up) @ down[expert].float().t()
        out.index_add_(0, token_idx, ye * weights[token_idx, k_idx, None].float())
    if shared is not None:
        xf = x.float()
        act = F.silu(xf @ shared.gate_proj.float().t()) * (xf @ shared.up_proj.float().t())
        out += torch.sigmoid(xf @ shared.gate.float().t()) * (act @ shared.down_proj.float().t())
    return out.to(x.dtype)


def moe_combine_ref(
    expert_out: torch.Tensor,
    expert_rows: torch.Tensor,
    weights: torch.Tensor,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """Each token's routed sum read from a buffer of expert outputs: ``out[t] = sum_k weights[t, k] *
    expert_out[expert_rows[t, k]]``, plus ``shared[t]`` (the gated shared expert's output, already computed)
    when given; fp32 math, rounded once.

    expert_out: [R, H], the experts' outputs in any row order (rows that ``expert_rows`` does not name are
    never read); expert_rows: [T, top_k] int; weights: [T, top_k]; shared: [T, H] or None -> [T, H]
    (expert_out.dtype).
    """
    out = (expert_out[expert_rows].float() * weights.float().unsqueeze(-1)).sum(dim=1)
    if shared is not None:
        out = out + shared.float()
    return out.to(expert_out.dtype)


# ---------------------------------------------------------------------------------------------------
# Triton

if HAS_TRITON:

    @triton.jit
    def route_rows(
        logits,
        es,
        BLOCK_T: tl.constexpr,
        TOP_K: tl.constexpr,
        BLOCK_TOPK: tl.constexpr,
        RENORMALIZE: tl.constexpr,
    ):
        # The routing of a [BLOCK_T, BLOCK_E] tile of fp32 logits (padding experts -inf; es the expert index
        # of each column) -> (weights [BLOCK_T, BLOCK_TOPK] fp32, ids [BLOCK_T, BLOCK_TOPK] int32), best first.
        # Shared by _moe_route_kernel and kernels.moe_router's fused router, and written so that its bits do
        # not depend on how the compiler lays the tile out over threads (the two kernels load their logits in
        # different dtypes, so their tiles' layouts, and with them the order of a row's sums, can differ): the
        # top_k are picked by repeated argmax on the logits (exact), each picked weight is exp(logit - max)
        # (max exact; one nonzero term summed), and renormalising divides by the picked values summed in pick
        # order, a fixed sequence. Only RENORMALIZE=False divides by the sum of every expert's exp, a row
        # reduction whose order follows the layout.
        row_max = tl.max(logits, axis=1)
        exps = tl.exp(logits - row_max[:, None])
        ks = tl.arange(0, BLOCK_TOPK)
        top_e = tl.zeros([BLOCK_T, BLOCK_TOPK], dtype=tl.float32)
        top_i = tl.zeros([BLOCK_T, BLOCK_TOPK], dtype=tl.int32)
        picked = tl.zeros([BLOCK_T], dtype=tl.float32)
        remaining = logits
        for k in tl.static_range(TOP_K):
            best = tl.argmax(remaining, axis=1, tie_break_left=True)  # [BLOCK_T]
            chosen = es[None, :] == best[:, None]
            e = tl.sum(tl.where(chosen, exps, 0.0), axis=1)  # one nonzero term: exact in any order
            top_e = tl.where(ks[None, :] == k, e[:, None], top_e)
            top_i = tl.where(ks[None, :] == k, best[:, None], top_i)
            picked += e
            remaining = tl.where(chosen, float("-inf"), remaining)
        if RENORMALIZE:
            top_p = top_e / picked[:, None]
        else:
            top_p = top_e / tl.sum(exps, axis=1)[:, None]
        return top_p, top_i

    @triton.jit
    def _moe_route_kernel(
        logits_ptr,
        weights_ptr,
        ids_ptr,
        num_tokens,
        num_experts,
        logits_stride,
        TOP_K: tl.constexpr,
        BLOCK_TOPK: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_E: tl.constexpr,
        RENORMALIZE: tl.constexpr,
    ):
        # grid (cdiv(T, BLOCK_T),): one program routes BLOCK_T tokens (route_rows; each row's reductions along
        # its own experts, so a token's result does not depend on its neighbours).
        rs = tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)
        es = tl.arange(0, BLOCK_E)
        e_ok = es < num_experts
        row_ok = rs < num_tokens
        offs = rs[:, None].to(tl.int64) * logits_stride + es[None, :]
        logits = tl.load(logits_ptr + offs, mask=row_ok[:, None] & e_ok[None, :], other=0.0).to(tl.float32)
        logits = tl.where(e_ok[None, :], logits, float("-inf"))  # padding experts: never picked
        top_p, top_i = route_rows(logits, es, BLOCK_T, TOP_K, BLOCK_TOPK, RENORMALIZE)
        ks = tl.arange(0, BLOCK_TOPK)
        out = rs[:, None] * TOP_K + ks[None, :]
        out_mask = row_ok[:, None] & (ks < TOP_K)[None, :]
        tl.store(weights_ptr + out, top_p, mask=out_mask)
        tl.store(ids_ptr + out, top_i.to(tl.int64), mask=out_mask)

    @triton.jit
    def _moe_routed_slot(gate_up_ptr, ids_ptr, weights_ptr, routed, w_stride_e):
        # A routed slot's gate rows (scalar base pointer: its expert's gate_up) and routing weight.
        expert = tl.load(ids_ptr + routed).to(tl.int64)
        return gate_up_ptr + expert * w_stride_e, tl.load(weights_ptr + routed).to(tl.float32)

    @triton.jit
    def _moe_shared_weight(x_row, score_ptr, HIDDEN: tl.constexpr, BLOCK_K: tl.constexpr):
        # The shared slot's weight sigmoid(score . x) in fp32: BLOCK_K columns a step summed lane-wise, then
        # one reduction (every row tile of the token computes the same value).
        score = tl.zeros([BLOCK_K], dtype=tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_mask = cols < HIDDEN
            xk = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            score += tl.load(score_ptr + cols, mask=col_mask, other=0.0).to(tl.float32) * xk
        return tl.sigmoid(tl.sum(score, axis=0))

    @triton.jit
    def _moe_gate_up_kernel(
        x_ptr,
        gate_up_ptr,
        ids_ptr,
        weights_ptr,
        order_ptr,
        shared_gate_ptr,
        shared_up_ptr,
        shared_score_ptr,
        act_ptr,
        x_stride,
        w_stride_e,
        w_stride_n,
        shared_stride_n,
        HIDDEN: tl.constexpr,
        INTER: tl.constexpr,
        TOP_K: tl.constexpr,
        SHARED_INTER: tl.constexpr,
        SORTED: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # grid (T * SLOTS, cdiv(max(I, I_s), BLOCK_N)), SLOTS = TOP_K (+ 1 with a shared expert, the last
        # slot): one program streams BLOCK_N gate rows and the matching BLOCK_N up rows of one (token, slot)
        # pair over H (BLOCK_K columns a step, fp32 accumulate) and stores act = w * silu(gate) * up for
        # those rows, in fp32, at act[token, slot * I + row]. A routed slot takes its expert's rows of
        # gate_up and its routing weight; the shared slot (SHARED_INTER > 0) takes the rows of the shared
        # gate and up tensors and w = sigmoid(shared_score . x), which it computes first. Rows past the
        # slot's own intermediate size are masked. SORTED: program p takes pair order[p] (pairs sorted by
        # expert, so the pairs sharing an expert are neighbours in launch order).
        SLOTS: tl.constexpr = TOP_K + (1 if SHARED_INTER > 0 else 0)
        ACT_STRIDE: tl.constexpr = TOP_K * INTER + SHARED_INTER
        pair = tl.program_id(0)
        if SORTED:
            pair = tl.load(order_ptr + pair).to(tl.int32)
        tile = tl.program_id(1)
        token = pair // SLOTS
        slot = pair % SLOTS
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        x_row = x_ptr + token.to(tl.int64) * x_stride
        routed = token * TOP_K + slot  # the pair's entry of ids and weights (a routed slot)
        # The branch picks scalars (base pointers, row stride, weight) and the row mask only; the address
        # tiles are built after it, the same for both kinds of slot. NOTE: the scalar base pointers carried
        # out of the branch must share one element type (the launcher checks the dtypes).
        if SHARED_INTER > 0:
            if slot == TOP_K:
                gate_base, up_base = shared_gate_ptr, shared_up_ptr
                stride_n = shared_stride_n
                row_mask = rows < SHARED_INTER
                weight = _moe_shared_weight(x_row, shared_score_ptr, HIDDEN, BLOCK_K)
            else:
                gate_base, weight = _moe_routed_slot(gate_up_ptr, ids_ptr, weights_ptr, routed, w_stride_e)
                up_base = gate_base + INTER * w_stride_n
                stride_n = w_stride_n
                row_mask = rows < INTER
        else:
            gate_base, weight = _moe_routed_slot(gate_up_ptr, ids_ptr, weights_ptr, routed, w_stride_e)
            up_base = gate_base + INTER * w_stride_n
            stride_n = w_stride_n
            row_mask = rows < INTER
        gate_rows = gate_base + rows[:, None] * stride_n
        up_rows = up_base + rows[:, None] * stride_n
        acc_gate = tl.zeros([BLOCK_N], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N], dtype=tl.float32)
        for k0 in range(0, HIDDEN, BLOCK_K):
            cols = k0 + tl.arange(0, BLOCK_K)
            col_mask = cols < HIDDEN
            xk = tl.load(x_row + cols, mask=col_mask, other=0.0).to(tl.float32)
            mask = row_mask[:, None] & col_mask[None, :]
            gate = tl.load(gate_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            up = tl.load(up_rows + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            acc_gate += tl.sum(gate * xk[None, :], axis=1)
            acc_up += tl.sum(up * xk[None, :], axis=1)
        act = acc_gate * tl.sigmoid(acc_gate) * acc_up * weight
        tl.store(act_ptr + token.to(tl.int64) * ACT_STRIDE + slot * INTER + rows, act, mask=row_mask)

    @triton.jit
    def _moe_down_kernel(
        act_ptr,
        down_ptr,
        ids_ptr,
        shared_down_ptr,
        out_ptr,
        w_stride_e,
        w_stride_h,
        shared_stride_h,
        out_stride,
        HIDDEN: tl.constexpr,
        INTER: tl.constexpr,
        TOP_K: tl.constexpr,
        SHARED_INTER: tl.constexpr,
        BLOCK_TOPK: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_I: tl.constexpr,
    ):
        # grid (T, cdiv(H, BLOCK_H)): one program computes BLOCK_H outputs of one token, loading those down
        # rows of all its TOP_K experts at once ([TOP_K, BLOCK_H, BLOCK_I] a step) against the weighted act,
        # then (SHARED_INTER > 0) the shared expert's down rows ([BLOCK_H, BLOCK_I] a step) against its act;
        # out = (sum over the routed experts) + shared, a fixed-order reduction inside the program (no
        # atomics, batch invariant).
        ACT_STRIDE: tl.constexpr = TOP_K * INTER + SHARED_INTER
        token = tl.program_id(0)
        tile = tl.program_id(1)
        ks = tl.arange(0, BLOCK_TOPK)
        k_mask = ks < TOP_K
        act_row = act_ptr + token.to(tl.int64) * ACT_STRIDE
        experts = tl.load(ids_ptr + token.to(tl.int64) * TOP_K + ks, mask=k_mask, other=0).to(tl.int64)
        rows = tile * BLOCK_H + tl.arange(0, BLOCK_H)
        row_mask = rows < HIDDEN
        w_rows = down_ptr + experts[:, None, None] * w_stride_e + rows[None, :, None] * w_stride_h
        kh_mask = k_mask[:, None, None] & row_mask[None, :, None]
        acc = tl.zeros([BLOCK_TOPK, BLOCK_H], dtype=tl.float32)
        for i0 in range(0, INTER, BLOCK_I):
            cols = i0 + tl.arange(0, BLOCK_I)
            col_mask = cols < INTER
            act = tl.load(
                act_row + ks[:, None] * INTER + cols[None, :],
                mask=k_mask[:, None] & col_mask[None, :],
                other=0.0,
            )
            w = tl.load(w_rows + cols[None, None, :], mask=kh_mask & col_mask[None, None, :], other=0.0)
            acc += tl.sum(w.to(tl.float32) * act[:, None, :], axis=2)
        out = tl.sum(acc, axis=0)
        if SHARED_INTER > 0:
            shared_rows = shared_down_ptr + rows[:, None] * shared_stride_h
            acc_shared = tl.zeros([BLOCK_H], dtype=tl.float32)
            for i0 in range(0, SHARED_INTER, BLOCK_I):
                cols = i0 + tl.arange(0, BLOCK_I)
                col_mask = cols < SHARED_INTER
                act = tl.load(act_row + TOP_K * INTER + cols, mask=col_mask, other=0.0)
                w = tl.load(
                    shared_rows + cols[None, :], mask=row_mask[:, None] & col_mask[None, :], other=0.0
                )
                acc_shared += tl.sum(w.to(tl.float32) * act[None, :], axis=1)
            out += acc_shared
        tl.store(
            out_ptr + token.to(tl.int64) * out_stride + rows, out.to(out_ptr.dtype.element_ty), mask=row_mask
        )

    @triton.jit
    def _moe_combine_kernel(
        expert_out_ptr,
        rows_ptr,
        weights_ptr,
        shared_ptr,
        out_ptr,
        expert_out_stride,
        shared_stride,
        out_stride,
        HIDDEN: tl.constexpr,
        TOP_K: tl.constexpr,
        HAS_SHARED: tl.constexpr,
        BLOCK_TOPK: tl.constexpr,
        BLOCK_H: tl.constexpr,
    ):
        # grid (T, cdiv(H, BLOCK_H)): one program loads BLOCK_H columns of its token's TOP_K expert-output
        # rows at once ([BLOCK_TOPK, BLOCK_H], every load in flight together), sums them weighted in fp32
        # (a fixed-order reduction inside the program: no atomics, batch invariant), adds the shared
        # expert's output (HAS_SHARED) and rounds once. Only the rows named in rows_ptr are read.
        token = tl.program_id(0).to(tl.int64)
        cols = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        col_mask = cols < HIDDEN
        ks = tl.arange(0, BLOCK_TOPK)
        k_mask = ks < TOP_K
        rows = tl.load(rows_ptr + token * TOP_K + ks, mask=k_mask, other=0).to(tl.int64)
        weights = tl.load(weights_ptr + token * TOP_K + ks, mask=k_mask, other=0.0).to(tl.float32)
        vals = tl.load(
            expert_out_ptr + rows[:, None] * expert_out_stride + cols[None, :],
            mask=k_mask[:, None] & col_mask[None, :],
            other=0.0,
        )
        out = tl.sum(vals.to(tl.float32) * weights[:, None], axis=0)
        if HAS_SHARED:
            out += tl.load(shared_ptr + token * shared_stride + cols, mask=col_mask, other=0.0).to(tl.float32)
        tl.store(out_ptr + token * out_stride + cols, out.to(out_ptr.dtype.element_ty), mask=col_mask)


ROUTE_BLOCK_T = 8  # tokens a routing program (kernels.moe_router routes its <= 8 rows as one such tile)


def moe_route(
    router_logits: torch.Tensor, top_k: int, renormalize: bool = True
) -> tuple[torch.Tensor, torch.Tensor]:
    """Launcher for ``moe_route_ref`` (same contract): one program per ``ROUTE_BLOCK_T`` tokens, no host sync.

    The top_k are picked on the fp32 logits (largest first; a tie goes to the lower expert id), the same
    choice as on the probabilities except where two probabilities round equal. Renormalised weights are
    ``exp(l_k - max) / sum_j exp(l_j - max)`` over the picked experts (``route_rows``): the reference's value
    to a few fp32 ulps, and bitwise the fused router's (``kernels.moe_router``).
    """
    if not use_triton(router_logits):
        return moe_route_ref(router_logits, top_k, renormalize)
    num_tokens, num_experts = router_logits.shape
    assert 1 <= top_k <= num_experts, f"top_k {top_k} for {num_experts} experts"
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    device = router_logits.device
    weights = torch.empty(num_tokens, top_k, dtype=torch.float32, device=device)
    expert_ids = torch.empty(num_tokens, top_k, dtype=torch.int64, device=device)
    if num_tokens:
        _moe_route_kernel[(triton.cdiv(num_tokens, ROUTE_BLOCK_T),)](
            logits, weights, expert_ids, num_tokens, num_experts, logits.stride(0),
            TOP_K=top_k, BLOCK_TOPK=triton.next_power_of_2(top_k), BLOCK_T=ROUTE_BLOCK_T,
            BLOCK_E=triton.next_power_of_2(num_experts), RENORMALIZE=renormalize, num_warps=4,
        )  # fmt: skip
    return weights, expert_ids


class MoeTiles(NamedTuple):
    """Tile sizes of the two expert kernels (a function of the geometry only: see the module docstring)."""

    block_n: int  # _moe_gate_up_kernel: rows of I per program (the same rows of gate and of up)
    block_k: int  # _moe_gate_up_kernel: columns of H per loop step
    warps_gate_up: int
    block_h: int  # _moe_down_kernel: output rows of H per program
    block_i: int  # _moe_down_kernel: columns of I per loop step (all top_k experts at once)
    warps_down: int


def moe_tiles(hidden: int, inter: int, top_k: int, dtype: torch.dtype) -> MoeTiles:
    """The tiles ``moe_experts`` uses. NOTE: never make them depend on the token count: a token's output
    must not change with the batch it runs in.

    Qwen3.6-35B-A3B (H 2048, I 512, top_k 8, bf16) at T=1: gate_up 8 pairs x 128 row tiles = 1,024
    programs (1,152 with the shared expert, I_s 512: a ninth pair) of 8 warps, each streaming 2 x 4 rows x
    2048 bf16 (32 KiB) in one step; down 512 programs of 4 warps, each loading 8 experts x 4 rows x 256
    (16 KiB) a step over 2 steps, then the shared expert's 4 rows x 256 twice. The shared expert uses the
    routed tiles (its I_s need not be a multiple of them: rows and columns past I_s are masked). Chosen by
    the H200 sweep in bench/results/kernels_h200_2026-12-02_session3.json (bench/kernels/hot_path.py
    --moe-only): gate_up 11.9 us per layer at T=1 (63.0 at T=8) against 13.4 (66.8) for the previous
    16 x 512 tile, down 7.5 us (36.6) against 8.4 (36.9) for 4 x 512 with 8 warps.
    """
    wide = dtype.itemsize <= 2  # bf16/fp16 tiles hold twice the elements of fp32 ones in the same registers
    per_step = 16384 if wide else 8192
    block_n = min(4, triton.next_power_of_2(inter))
    block_k = min(per_step // 8, triton.next_power_of_2(hidden))
    block_h = min(4, triton.next_power_of_2(hidden))
    block_topk = triton.next_power_of_2(top_k)
    block_i = max(16, min(triton.next_power_of_2(inter), per_step // (2 * block_topk * block_h)))
    warps_gate_up = 8 if block_n * block_k >= 8192 else 4
    warps_down = 8 if block_topk * block_h * block_i >= 16384 else 4
    return MoeTiles(block_n, block_k, warps_gate_up, block_h, block_i, warps_down)


def moe_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: SharedExpert | None = None,
) -> torch.Tensor:
    """Launcher for ``moe_experts_ref`` (same contract), for few tokens (decode, MTP verify, small batches).

    Two kernels that read the chosen experts' weights where they lie, once per pair (once per distinct
    expert from HBM: see the module docstring); no host sync, CUDA-graph safe, batch invariant. With
    ``shared`` the same two launches also run the shared expert and its sigmoid gate (a whole MoE block's
    experts); its weights must have the routed experts' dtype. Every expert's weights are read per pair,
    so a large batch (prefill) wants a grouped GEMM instead.
    """
    if not use_triton(x, gate_up, down, weights, expert_ids, *(shared or ())):
        return moe_experts_ref(x, gate_up, down, weights, expert_ids, shared)
    tiles = moe_tiles(x.shape[-1], down.shape[-1], expert_ids.shape[-1], gate_up.dtype)
    return _launch_moe_experts(x, gate_up, down, weights, expert_ids, shared, tiles)


def _launch_moe_experts(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    down: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: SharedExpert | None,
    tiles: MoeTiles,
) -> torch.Tensor:
    num_tokens, hidden = x.shape
    num_experts, inter = down.shape[0], down.shape[2]
    top_k = expert_ids.shape[1]
    assert gate_up.shape == (num_experts, 2 * inter, hidden), f"gate_up {tuple(gate_up.shape)}"
    assert down.shape == (num_experts, hidden, inter), f"down {tuple(down.shape)}"
    assert expert_ids.shape == (num_tokens, top_k) and weights.shape == (num_tokens, top_k), (
        f"expert_ids {tuple(expert_ids.shape)}, weights {tuple(weights.shape)} for {num_tokens} tokens"
    )
    assert gate_up.stride(2) == 1 and down.stride(2) == 1, "expert weights need unit stride along the rows"
    if shared is not None:
        _check_shared(shared, hidden, gate_up.dtype)
    x = x if x.stride(1) == 1 else x.contiguous()
    weights, expert_ids = weights.contiguous(), expert_ids.contiguous()
    out = torch.empty(num_tokens, hidden, dtype=x.dtype, device=x.device)
    if num_tokens == 0:
        return out
    shared_inter = shared.down_proj.shape[1] if shared is not None else 0
    act = torch.empty(num_tokens, top_k * inter + shared_inter, dtype=torch.float32, device=x.device)
    _launch_gate_up(x, gate_up, weights, expert_ids, shared, act, tiles)
    _launch_down(act, down, expert_ids, shared, out, tiles)
    return out


def _check_shared(shared: SharedExpert, hidden: int, dtype: torch.dtype) -> None:
    shared_inter = shared.down_proj.shape[1]
    shapes = tuple(tuple(t.shape) for t in shared)
    assert shapes == ((shared_inter, hidden), (shared_inter, hidden), (hidden, shared_inter), (1, hidden)), (
        f"shared expert shapes {shapes} for H={hidden}"
    )
    assert all(t.stride(-1) == 1 for t in shared), "shared expert weights need unit stride along the rows"
    assert shared.gate_proj.stride(0) == shared.up_proj.stride(0), (
        f"shared gate_proj/up_proj row strides {shared.gate_proj.stride(0)} != {shared.up_proj.stride(0)}"
    )
    # NOTE: the kernel picks the shared or a routed expert's row pointers at run time: one element type
    assert shared.gate_proj.dtype == shared.up_proj.dtype == shared.down_proj.dtype == dtype, (
        f"shared expert dtypes {[t.dtype for t in shared[:3]]} != the routed experts' {dtype}"
    )


# More routed (token, expert) pairs than this run in pair order sorted by expert (one small sort launch):
# the programs of one row tile then no longer fit one wave, and a shared expert's repeats must stay
# neighbours.
SORT_MIN_PAIRS = 256


def _launch_gate_up(
    x: torch.Tensor,
    gate_up: torch.Tensor,
    weights: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: SharedExpert | None,
    act: torch.Tensor,
    tiles: MoeTiles,
) -> None:
    """act [T, top_k * I + I_s] fp32 <- weight * silu(gate) * up of every (token, slot) pair (checked inputs).

    Which program runs which pair changes no pair's arithmetic: sorting keeps the batch invariance.
    """
    num_tokens, top_k = expert_ids.shape
    inter = gate_up.shape[1] // 2
    shared_inter = shared.down_proj.shape[1] if shared is not None else 0
    slots = top_k + (shared is not None)
    sort = num_tokens * top_k > SORT_MIN_PAIRS
    order = expert_ids
    if sort and shared is None:
        order = expert_ids.view(-1).argsort()
    elif sort:  # the shared slots sort last (key E, past every expert id)
        keys = torch.cat([expert_ids, expert_ids.new_full((num_tokens, 1), gate_up.shape[0])], dim=1)
        order = keys.view(-1).argsort()
    # without a shared expert its pointers are never read: any tensor of the experts' dtype stands in
    gate_s, up_s, score_s = (
        (shared.gate_proj, shared.up_proj, shared.gate) if shared is not None else (gate_up,) * 3
    )
    _moe_gate_up_kernel[(num_tokens * slots, triton.cdiv(max(inter, shared_inter), tiles.block_n))](
        x, gate_up, expert_ids, weights, order, gate_s, up_s, score_s, act,
        x.stride(0), gate_up.stride(0), gate_up.stride(1), gate_s.stride(0) if shared is not None else 0,
        HIDDEN=x.shape[1], INTER=inter, TOP_K=top_k, SHARED_INTER=shared_inter, SORTED=sort,
        BLOCK_N=tiles.block_n, BLOCK_K=tiles.block_k, num_warps=tiles.warps_gate_up,
    )  # fmt: skip


def _launch_down(
    act: torch.Tensor,
    down: torch.Tensor,
    expert_ids: torch.Tensor,
    shared: SharedExpert | None,
    out: torch.Tensor,
    tiles: MoeTiles,
) -> None:
    """out [T, H] <- sum over each token's experts of down @ act, then + the shared expert's (checked inputs)."""
    num_tokens, top_k = expert_ids.shape
    hidden, inter = out.shape[1], down.shape[2]
    shared_inter = shared.down_proj.shape[1] if shared is not None else 0
    down_s = shared.down_proj if shared is not None else down
    _moe_down_kernel[(num_tokens, triton.cdiv(hidden, tiles.block_h))](
        act, down, expert_ids, down_s, out, down.stride(0), down.stride(1),
        down_s.stride(0) if shared is not None else 0, out.stride(0),
        HIDDEN=hidden, INTER=inter, TOP_K=top_k, SHARED_INTER=shared_inter,
        BLOCK_TOPK=triton.next_power_of_2(top_k), BLOCK_H=tiles.block_h, BLOCK_I=tiles.block_i,
        num_warps=tiles.warps_down,
    )  # fmt: skip


def moe_combine(
    expert_out: torch.Tensor,
    expert_rows: torch.Tensor,
    weights: torch.Tensor,
    shared: torch.Tensor | None = None,
) -> torch.Tensor:
    """Launcher for ``moe_combine_ref`` (same contract): each token gathers and sums its own rows (no
    scatter, no atomics, no fp32 [T * top_k, H] intermediate); no host sync, batch invariant.

    Tiles: BLOCK_H = min(H, 8192 / BLOCK_TOPK, 1024) columns (powers of two) of all top_k rows a program, 4
    warps (35B-A3B, top_k 8, H 2048: [8, 1024] a program, 64 elements a thread, 16-byte loads, 2 programs a
    token). The row indices are trusted (they come from the grouping; nothing is read back to check them).
    """
    if not use_triton(expert_out, expert_rows, weights, shared):
        return moe_combine_ref(expert_out, expert_rows, weights, shared)
    num_tokens, top_k = expert_rows.shape
    hidden = expert_out.shape[1]
    assert weights.shape == (num_tokens, top_k), (
        f"weights {tuple(weights.shape)} for rows {(num_tokens, top_k)}"
    )
    assert expert_out.stride(1) == 1, "expert_out needs unit stride along H"
    if shared is not None:
        assert shared.shape == (num_tokens, hidden), (
            f"shared {tuple(shared.shape)} for {(num_tokens, hidden)}"
        )
        assert shared.stride(1) == 1, "shared needs unit stride along H"
    expert_rows, weights = expert_rows.contiguous(), weights.contiguous()
    out = torch.empty(num_tokens, hidden, dtype=expert_out.dtype, device=expert_out.device)
    if num_tokens:
        block_topk = triton.next_power_of_2(top_k)
        block_h = min(1024, triton.next_power_of_2(hidden), max(16, 8192 // block_topk))
        # without a shared term its pointer is never read: any tensor stands in
        shared_t = shared if shared is not None else expert_out
        _moe_combine_kernel[(num_tokens, triton.cdiv(hidden, block_h))](
            expert_out, expert_rows, weights, shared_t, out,
            expert_out.stride(0), shared_t.stride(0), out.stride(0),
            HIDDEN=hidden, TOP_K=top_k, HAS_SHARED=shared is not None, BLOCK_TOPK=block_topk, BLOCK_H=block_h,
            num_warps=4,
        )  # fmt: skip
    return out
