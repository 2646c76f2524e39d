"""The Triton grouped GEMM of the groupwise-int routed experts for prefill: the quantized expert stacks read in
place (stored row-split layout, ``QuantWeight`` planes), each weight tile dequantized in registers before
``tl.dot`` (``triton_group``'s ``_tile_planes`` / ``_tile_values``: the dense ``_quant_gemm_group_kernel``'s
technique, the next K step's weight bytes loaded before the current step's decode), over the
expert-sorted padded rows of ``engine.model.mlp.ExpertGroups`` (``offs``: each expert's padded group end;
``token_idx``: the token of each row). Launcher and reference: ``moe_prefill.py``.

One kernel, two launches a layer (``GATE_UP`` a constexpr):

* gate_up (``GATE_UP``): ``act[r] = silu(gate_e . x[token_idx[r]]) * (up_e . x[token_idx[r]])`` for the rows r of
  expert e's group, BLOCK_N gate rows stacked over the same up rows in one weight tile and one fp32 accumulator
  ``[2 * BLOCK_N, BLOCK_M]``, split in the epilogue (x's rows gathered through
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

    from kernels.quant.triton_group import _tile_planes, _tile_values

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
        # the weight tile's rows: BLOCK_N of N (down), or BLOCK_N gate rows stacked over the same BLOCK_N up rows
        # (gate_up: one [2 * BLOCK_N, BLOCK_K] tile, one dot; at 8 warps each warpgroup owns 64 rows of it, where
        # two 64-row tiles would each be decoded by both warpgroups)
        ROWS: tl.constexpr = 2 * BLOCK_N if GATE_UP else BLOCK_N
        r = tl.arange(0, ROWS)
        ns = tl.program_id(1) * BLOCK_N + r % BLOCK_N
        w_rows = expert.to(tl.int64) * (2 * N if GATE_UP else N) + (r // BLOCK_N) * N + tl.minimum(ns, N - 1)
        acc = tl.zeros([ROWS, BLOCK_M], dtype=tl.float32)
        # the weight bytes are loaded one K step ahead (registers): their latency overlaps a step's decode and dot
        c, h, s = _tile_planes(codes_ptr, high_ptr, scales_ptr, w_rows, codes_stride, high_stride, scales_stride, 0,
                               BITS, GROUP, BLOCK_K)  # fmt: skip
        for k0 in tl.range(0, K_PAD, BLOCK_K, num_stages=NUM_STAGES):
            cols = k0 + tl.arange(0, BLOCK_K)
            at = tl.load(a_ptr + a_rows[None, :] + cols[:, None], mask=m_mask[None, :] & (cols < K)[:, None],
                         other=0.0)  # fmt: skip
            w = _tile_values(c, h, s, BITS, GROUP, BLOCK_K)
            k_next = tl.minimum(k0 + BLOCK_K, K_PAD - BLOCK_K)  # the last step reloads itself (never decoded)
            c, h, s = _tile_planes(codes_ptr, high_ptr, scales_ptr, w_rows, codes_stride, high_stride,
                                   scales_stride, k_next, BITS, GROUP, BLOCK_K)  # fmt: skip
            acc = tl.dot(w.to(dtype), at, acc)
        n_out = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        if GATE_UP:  # rows [0, BLOCK_N) gate, [BLOCK_N, 2 * BLOCK_N) up
            gate, up = tl.split(tl.permute(tl.reshape(acc, [2, BLOCK_N, BLOCK_M]), (1, 2, 0)))
            out = gate / (1.0 + tl.exp(-gate)) * up
        else:
            out = acc
        out_ptrs = out_ptr + ms[None, :].to(tl.int64) * N + n_out[:, None]
        tl.store(out_ptrs, out.to(dtype), mask=(n_out < N)[:, None] & m_mask[None, :])
