"""The Triton grouped GEMM of the groupwise-int routed experts for prefill: the quantized expert stacks read in
place (stored row-split layout, ``QuantWeight`` planes), each weight tile dequantized in registers before
``tl.dot`` (``triton_group._dequant_tile``: the dense ``_quant_gemm_group_kernel``'s technique), over the
expert-sorted padded rows of ``engine.model.mlp.ExpertGroups`` (``offs``: each expert's padded group end;
``token_idx``: the token of each row). Launcher and reference: ``moe_prefill.py``.

One kernel, two launches a layer (``GATE_UP`` a constexpr):

* gate_up (``GATE_UP``): ``act[r] = silu(gate_e . x[token_idx[r]]) * (up_e . x[token_idx[r]])`` for the rows r of
  expert e's group, gate and up each an fp32 accumulator ``[BLOCK_N, BLOCK_M]`` (x's rows gathered through
  ``token_idx``: no copy of x in the padded layout), the activation in fp32, rounded once to x's dtype;
* down: ``out[r] = down_e . act[r]``, rounded once to x's dtype; ``kernels.moe.moe_combine`` then sums each
  token's rows with the shared expert's output.

Grid ``(tiles_bound, cdiv(N, BLOCK_N))``: program ``(t, n)`` takes M-tile t of the flat list of every expert's
``cdiv(group rows, BLOCK_M)`` tiles (expert-major), found from ``offs`` inside the program (``_expert_tile``: the
tile counts' prefix sum over the E experts, a [BLOCK_E] vector), and weight rows ``[n * BLOCK_N, (n + 1) *
BLOCK_N)``. ``tiles_bound = cdiv(rows, BLOCK_M) + min(E, pairs)`` (rows: the padded layout's size, each non-empty
group adds at most one partial tile) comes from T, top_k, E and the tiles: no host sync; a program past the last
tile exits, and a tile's rows past its group's end are masked (they are the next expert's). Padding rows inside a
group (token 0's x) are computed and never read. ``out^T = W @ rows^T``: the dequantized weight tile is the dot's A
operand (registers), the rows' tile [BLOCK_K, BLOCK_M] its B.
"""

from __future__ import annotations

from kernels._dispatch import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.quant.triton_group import _dequant_tile

    @triton.jit
    def _expert_tile(offs_ptr, tile, NUM_EXPERTS: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_M: tl.constexpr):
        # M-tile ``tile`` of the flat list -> (expert, its first row, its group's end); expert == NUM_EXPERTS
        # when the tile lies past the last one. offs: [E] int32, each expert's padded group end (ascending).
        e = tl.arange(0, BLOCK_E)
        live = e < NUM_EXPERTS
        ends = tl.load(offs_ptr + e, mask=live, other=0)
        starts = tl.load(offs_ptr + e - 1, mask=live & (e > 0), other=0)
        counts = (ends - starts + BLOCK_M - 1) // BLOCK_M  # M-tiles of each group (0 for an empty one)
        tile_ends = tl.cumsum(counts, 0)
        expert = tl.sum((live & (tile_ends <= tile)).to(tl.int32), 0)
        mine = e == expert
        first_tile = tl.sum(tl.where(mine, tile_ends - counts, 0), 0)
        row0 = tl.sum(tl.where(mine, starts, 0), 0) + (tile - first_tile) * BLOCK_M
        return expert, row0, tl.sum(tl.where(mine, ends, 0), 0)

    @triton.jit
    def _quant_moe_grouped_kernel(
        a_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        offs_ptr,
        token_ptr,
        out_ptr,
        a_stride,
        codes_stride,
        high_stride,
        scales_stride,
        N: tl.constexpr,
        K: tl.constexpr,
        K_PAD: tl.constexpr,
        NUM_EXPERTS: tl.constexpr,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        GATE_UP: tl.constexpr,
        BLOCK_E: tl.constexpr,
        BLOCK_M: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
    ):
        # GATE_UP: a = x [T, K] gathered through token_idx, the weight [E * 2N, K] (expert e's gate rows
        # [e * 2N, e * 2N + N), then its up rows), out = act [rows, N]. Else a = act [rows, K] read in place, the
        # weight [E * N, K], out [rows, N]. out in a's dtype, row stride N.
        expert, row0, row_end = _expert_tile(offs_ptr, tl.program_id(0), NUM_EXPERTS, BLOCK_E, BLOCK_M)
        if expert >= NUM_EXPERTS:
            return
        dtype = a_ptr.dtype.element_ty
        ms = row0 + tl.arange(0, BLOCK_M)
        m_mask = ms < row_end
        if GATE_UP:
            a_rows = tl.load(token_ptr + ms, mask=m_mask, other=0).to(tl.int64) * a_stride
        else:
            a_rows = ms.to(tl.int64) * a_stride
        ns = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        ns_c = tl.minimum(ns, N - 1).to(tl.int64)
        w_rows = expert.to(tl.int64) * (2 * N if GATE_UP else N) + ns_c
        acc = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)
        acc_up = tl.zeros([BLOCK_N, BLOCK_M], dtype=tl.float32)  # GATE_UP only
        for k0 in tl.range(0, K_PAD, BLOCK_K, num_stages=NUM_STAGES):
            cols = k0 + tl.arange(0, BLOCK_K)
            at = tl.load(a_ptr + a_rows[None, :] + cols[:, None], mask=m_mask[None, :] & (cols < K)[:, None],
                         other=0.0)  # fmt: skip
            w = _dequant_tile(codes_ptr, high_ptr, scales_ptr, w_rows, codes_stride, high_stride, scales_stride,
                              k0, BITS, GROUP, BLOCK_K)  # fmt: skip
            acc = tl.dot(w.to(dtype), at, acc)
            if GATE_UP:
                w_up = _dequant_tile(codes_ptr, high_ptr, scales_ptr, w_rows + N, codes_stride, high_stride,
                                     scales_stride, k0, BITS, GROUP, BLOCK_K)  # fmt: skip
                acc_up = tl.dot(w_up.to(dtype), at, acc_up)
        if GATE_UP:
            acc = acc / (1.0 + tl.exp(-acc)) * acc_up
        out_ptrs = out_ptr + ms[None, :].to(tl.int64) * N + ns[:, None]
        tl.store(out_ptrs, acc.to(dtype), mask=(ns < N)[:, None] & m_mask[None, :])
