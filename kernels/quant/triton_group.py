"""Triton kernels of the linear layer on row-split groupwise weights (Q4/Q5/Q6/W8): a weight-streaming GEMV
for decode and a dequantize-then-``tl.dot`` GEMM for prefill. Launchers and references: ``quant_linear.py``.

Both read the payload's planes in place (``QuantWeight``: base codes, high bits, binary16 scales) and
dequantize in registers; there is no bf16 copy of the weight.

``_quant_gemv_group_kernel``, grid ``(cdiv(N, BLOCK_N), SPLIT_K)``: one program computes ``out^T [BLOCK_N, 16]``
for its weight rows and its split of K's groups, ``GROUPS_STEP`` groups a loop step. A group's codes become
exact floats in registers (``_group_nibbles``: the row's code bytes and high-plane bytes each read once,
contiguously, the high bits broadcast in registers; float32 through the bits of ``2^23 + offset code``, no
int -> float conversion instruction), interleaved back into K order, and rounded exactly to x's dtype (|code|
<= 127 fits bf16), so each group is one tensor-core dot against x's contiguous ``[GROUP, 16]`` tile with fp32
accumulation, scaled by the group's fp32 scale afterwards: the only roundings are the fp32 sums and the
output's. x's T rows (1..8) are the dot's 16 columns (masked); T is no compile-time constant and the tiles
depend on N and K only, so a row's output is bitwise the same in any batch. Split K (``gemv_tiles`` splits
until the grid has ~8 programs an SM: a decode GEMV is bound by the bytes in flight, not by work): fp32
partials ``[SPLIT_K, T, N]`` summed in split order by ``kernels.linear._linear_reduce_kernel``.

``_quant_gemm_group_kernel``, grid ``(cdiv(N, BLOCK_N), cdiv(T, BLOCK_T))``: ``out^T [BLOCK_N, BLOCK_T] = W
[BLOCK_N, K] @ x^T``; each K step dequantizes a weight tile ``[BLOCK_N, BLOCK_K]`` in registers (nibbles
interleaved back into K order, times the group scale, rounded to x's dtype: one rounding of the weight,
relative 2^-9 in bf16) and feeds it to ``tl.dot`` as the A operand with x's tile (async-copied to shared
memory, pipelined over ``NUM_STAGES``) as B. ``_dequant_tile`` (a weight tile as exact fp32 code * scale) is
shared with the dequantize kernel; its two halves (``_tile_planes``: the loads, ``_tile_values``: the decode) with
the routed experts' grouped GEMM (``triton_moe_grouped.py``), which loads the next tile's bytes before it decodes
the current one's.
"""

from __future__ import annotations

from kernels._dispatch import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.moe import _moe_shared_weight
    from kernels.pdl import pdl_launch_dependents, pdl_wait

    @triton.jit
    def _offset_value(u, SIGN: tl.constexpr):
        # the exact float32 of an offset code u = code + SIGN (int32, 0 <= u < 2^23): the bits of 2^23 + u minus
        # 2^23 + SIGN (one OR and one FADD; no int -> float conversion, which runs at a quarter of the FMA rate)
        return (u | 0x4B000000).to(tl.float32, bitcast=True) - (8388608.0 + SIGN)

    @triton.jit
    def _group_nibbles(
        codes_ptr, high_ptr, code_rows, high_rows, byte0, BITS: tl.constexpr, BYTES: tl.constexpr
    ):
        # The signed codes of lanes [2 * byte0, 2 * byte0 + 2 * BYTES) of each row as exact float32: (even
        # lanes, odd lanes), [rows, BYTES] each. code_rows / high_rows: the rows' offsets into the planes
        # [rows, 1]; byte0 a multiple of BYTES (a multiple of 4). Every plane is read once, contiguously: the
        # BYTES code bytes of a row and its BYTES / 4 (Q5) or BYTES / 2 (Q6) high bytes (``_nibble_values``).
        i = tl.arange(0, BYTES)
        c = tl.load(codes_ptr + code_rows + (byte0 + i)[None, :]).to(tl.int32)
        h = c  # unused for Q4
        if BITS == 5:
            h = tl.load(high_ptr + high_rows + (byte0 // 4 + tl.arange(0, BYTES // 4))[None, :]).to(tl.int32)
        if BITS == 6:
            h = tl.load(high_ptr + high_rows + (byte0 // 2 + tl.arange(0, BYTES // 2))[None, :]).to(tl.int32)
        return _nibble_values(c, h, BITS)

    @triton.jit
    def _nibble_values(c, h, BITS: tl.constexpr):
        # Loaded planes -> the signed codes as exact float32 (even lanes, odd lanes), [rows, BYTES] each. c: int32
        # [rows, BYTES] code bytes, column j holding lanes 2j, 2j + 1 (BYTES a multiple of 4, the first column's
        # lane a multiple of 8); h: int32 high bytes [rows, BYTES // 4] (Q5) or [rows, BYTES // 2] (Q6) of the
        # same lanes (ignored for Q4), each broadcast in registers to the code bytes whose lanes it holds.
        rows: tl.constexpr = c.shape[0]
        BYTES: tl.constexpr = c.shape[1]
        i = tl.arange(0, BYTES)
        lo = c & 15
        hi = c >> 4
        if BITS == 5:  # lane l's bit 4 is bit l % 8 of high byte l // 8: byte b holds lanes 2b, 2b + 1
            h = tl.reshape(tl.broadcast_to(h[:, :, None], [rows, BYTES // 4, 4]), [rows, BYTES])
            shift = (2 * (i % 4))[None, :]
            lo = lo | (((h >> shift) & 1) << 4)
            hi = hi | (((h >> (shift + 1)) & 1) << 4)
        if BITS == 6:  # lane l's bits 4, 5 are bits 2l % 8, 2l % 8 + 1 of high byte l // 4
            h = tl.reshape(tl.broadcast_to(h[:, :, None], [rows, BYTES // 2, 2]), [rows, BYTES])
            shift = (4 * (i % 2))[None, :]
            lo = lo | (((h >> shift) & 3) << 4)
            hi = hi | (((h >> (shift + 2)) & 3) << 4)
        sign: tl.constexpr = 1 << (BITS - 1)
        return _offset_value(lo ^ sign, sign), _offset_value(hi ^ sign, sign)

    @triton.jit
    def _small_to_bf16(v):
        # float32 values with at most 8 significant bits (codes; E2M1 x E4M3 products) -> bf16, exactly: the
        # high half of each float32's bits (the low half is zero), integer shifts instead of F2F conversions
        return (v.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def _w8_values(q):
        # W8 codes (int8) -> exact float32, through the offset code q + 128
        return _offset_value(q.to(tl.int32) + 128, 128)

    @triton.jit
    def _tile_planes(codes_ptr, high_ptr, scales_ptr, rows_c, codes_stride, high_stride, scales_stride, k0,
                     BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
        # The stored bytes of the weight tile [rows, BLOCK_K] of lanes [k0, k0 + BLOCK_K) of rows rows_c (int64
        # [rows], in range), as loaded: (codes, high, scales); codes [rows, BLOCK_K // 2] (W8: [rows, BLOCK_K]),
        # high [rows, BLOCK_K // 8] (Q5) or [rows, BLOCK_K // 4] (Q6) (the codes again for Q4 / W8, unused),
        # scales [rows, BLOCK_K // GROUP]. k0 and BLOCK_K multiples of GROUP (and of 8). ``_tile_values`` decodes
        # them; apart, a loop can load the next tile's bytes before it decodes this one's.
        code_rows = (rows_c * codes_stride)[:, None]
        if BITS == 8:
            c = tl.load(codes_ptr + code_rows + (k0 + tl.arange(0, BLOCK_K))[None, :])
        else:
            c = tl.load(codes_ptr + code_rows + (k0 // 2 + tl.arange(0, BLOCK_K // 2))[None, :])
        h = c
        high_rows = (rows_c * high_stride)[:, None]
        if BITS == 5:
            h = tl.load(high_ptr + high_rows + (k0 // 8 + tl.arange(0, BLOCK_K // 8))[None, :])
        if BITS == 6:
            h = tl.load(high_ptr + high_rows + (k0 // 4 + tl.arange(0, BLOCK_K // 4))[None, :])
        groups: tl.constexpr = BLOCK_K // GROUP
        s = tl.load(
            scales_ptr + (rows_c * scales_stride)[:, None] + (k0 // GROUP + tl.arange(0, groups))[None, :]
        )
        return c, h, s

    @triton.jit
    def _tile_values(c, h, s, BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):
        # ``_tile_planes``' bytes -> the weight tile [rows, BLOCK_K]: code * group scale, exact float32 (the
        # caller rounds it once to its dtype)
        if BITS == 8:
            q = _w8_values(c)
        else:
            lo, hi = _nibble_values(c.to(tl.int32), h.to(tl.int32), BITS)
            q = tl.interleave(lo, hi)  # [rows, BLOCK_K] in K order
        rows: tl.constexpr = q.shape[0]
        groups: tl.constexpr = BLOCK_K // GROUP
        s = tl.reshape(tl.broadcast_to(s.to(tl.float32)[:, :, None], [rows, groups, GROUP]), [rows, BLOCK_K])
        return q * s

    @triton.jit
    def _dequant_tile(codes_ptr, high_ptr, scales_ptr, rows_c, codes_stride, high_stride, scales_stride, k0,
                      BITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_K: tl.constexpr):  # fmt: skip
        # The weight tile [rows, BLOCK_K] of lanes [k0, k0 + BLOCK_K) of rows rows_c: ``_tile_planes`` then
        # ``_tile_values`` (the GEMM's weight tiles and the dequantize kernel's)
        c, h, s = _tile_planes(codes_ptr, high_ptr, scales_ptr, rows_c, codes_stride, high_stride, scales_stride,
                               k0, BITS, GROUP, BLOCK_K)  # fmt: skip
        return _tile_values(c, h, s, BITS, GROUP, BLOCK_K)

    @triton.jit
    def _quant_gemv_group_kernel(
        x_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        out_ptr,
        N,
        T,
        K,
        x_stride,
        codes_stride,
        high_stride,
        scales_stride,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        GROUPS_SPLIT: tl.constexpr,
        GROUPS_STEP: tl.constexpr,
        BLOCK_N: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), SPLIT_K): out^T [BLOCK_N, 16] for the weight rows of program_id(0) and the
        # GROUPS_SPLIT groups of split program_id(1) (see the module docstring). GROUPS_SPLIT is a multiple of
        # GROUPS_STEP. out: [T, N] in x's dtype (one split) or fp32 partials [SPLIT_K, T, N].
        BLOCK_T: tl.constexpr = 16
        HALF: tl.constexpr = GROUP // 2
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        dtype = x_ptr.dtype.element_ty
        tile = tl.program_id(0)
        split = tl.program_id(1)
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)  # clamped: no row mask on the loads
        code_rows = (rows_c * codes_stride)[:, None]
        high_rows = (rows_c * high_stride)[:, None]
        ts = tl.arange(0, BLOCK_T)
        t_mask = (ts < T)[None, :]
        x_rows = ts[None, :].to(tl.int64) * x_stride
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        g_base = split * GROUPS_SPLIT
        for gs in tl.range(0, GROUPS_SPLIT, GROUPS_STEP, num_stages=NUM_STAGES):
            for j in tl.static_range(GROUPS_STEP):
                g = g_base + gs + j
                lanes = g * GROUP + tl.arange(0, GROUP)
                xt = tl.load(x_ptr + x_rows + lanes[:, None], mask=t_mask & (lanes < K)[:, None], other=0.0)
                if BITS == 8:
                    q = _w8_values(tl.load(codes_ptr + code_rows + lanes[None, :]))  # [BLOCK_N, GROUP]
                else:
                    lo, hi = _group_nibbles(codes_ptr, high_ptr, code_rows, high_rows, g * HALF, BITS, HALF)
                    q = tl.interleave(lo, hi)  # [BLOCK_N, GROUP] in K order
                if dtype == tl.bfloat16:
                    part = tl.dot(_small_to_bf16(q), xt)
                else:
                    part = tl.dot(q.to(dtype), xt)
                scale = tl.load(scales_ptr + rows_c * scales_stride + g).to(tl.float32)
                acc += part * scale[:, None]
        out_ptrs = out_ptr + split * (T * N) + ts[None, :] * N + rows[:, None]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & t_mask)

    @triton.jit
    def _quant_gemm_group_kernel(
        x_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        out_ptr,
        N,
        T,
        K,
        x_stride,
        codes_stride,
        high_stride,
        scales_stride,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        K_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), cdiv(T, BLOCK_T)): out^T [BLOCK_N, BLOCK_T] = W_tile @ x_tile^T over K_PAD in
        # BLOCK_K steps (a multiple of GROUP); the weight tile is dequantized in registers (see the module
        # docstring). out: [T, N] in x's dtype.
        dtype = x_ptr.dtype.element_ty
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)
        ts = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_mask = (ts < T)[None, :]
        x_rows = ts[None, :].to(tl.int64) * x_stride
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for k0 in tl.range(0, K_PAD, BLOCK_K, num_stages=NUM_STAGES):
            w = _dequant_tile(codes_ptr, high_ptr, scales_ptr, rows_c, codes_stride, high_stride, scales_stride,
                              k0, BITS, GROUP, BLOCK_K).to(dtype)  # fmt: skip
            cols = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(x_ptr + x_rows + cols[:, None], mask=t_mask & (cols < K)[:, None], other=0.0)
            acc = tl.dot(w, xt, acc)
        out_ptrs = out_ptr + ts[None, :].to(tl.int64) * N + rows[:, None]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & t_mask)

    @triton.jit
    def _group_dot(codes_ptr, high_ptr, scales_ptr, rows_c, codes_stride, high_stride, scales_stride, v_ptr,
                   v_len, g, BITS: tl.constexpr, GROUP: tl.constexpr):  # fmt: skip
        # sum over group g of each row's codes times v (fp32, lanes >= v_len are 0), times the group's scale:
        # fp32 [rows] (CUDA cores: one vector v, no tensor-core dot)
        HALF: tl.constexpr = GROUP // 2
        code_rows = (rows_c * codes_stride)[:, None]
        if BITS == 8:
            lanes = g * GROUP + tl.arange(0, GROUP)
            q = _w8_values(tl.load(codes_ptr + code_rows + lanes[None, :]))
            v = tl.load(v_ptr + lanes, mask=lanes < v_len, other=0.0).to(tl.float32)
            part = tl.sum(q * v[None, :], axis=1)
        else:
            high_rows = (rows_c * high_stride)[:, None]
            lo, hi = _group_nibbles(codes_ptr, high_ptr, code_rows, high_rows, g * HALF, BITS, HALF)
            even = g * GROUP + 2 * tl.arange(0, HALF)
            ve = tl.load(v_ptr + even, mask=even < v_len, other=0.0).to(tl.float32)
            vo = tl.load(v_ptr + even + 1, mask=even + 1 < v_len, other=0.0).to(tl.float32)
            part = tl.sum(lo * ve[None, :] + hi * vo[None, :], axis=1)
        return part * tl.load(scales_ptr + rows_c * scales_stride + g).to(tl.float32)

    @triton.jit
    def _quant_moe_shared_gate(x_row, score_ptr, gate_ptr, pair, TOP_K: tl.constexpr, HIDDEN: tl.constexpr):
        # The shared expert's gate sigmoid(score . x) of the pair's token, fp32 (``kernels.moe``'s shared-slot
        # weight: 256 lanes a step summed lane-wise, then one reduction), stored by the token's first program
        # (slot 0, row tile 0) only; the down kernel reads it
        if (pair % TOP_K == 0) & (tl.program_id(1) == 0):
            tl.store(gate_ptr + pair // TOP_K, _moe_shared_weight(x_row, score_ptr, HIDDEN, 256))

    @triton.jit
    def _quant_moe_shared_term(shared_ptr, gate_ptr, shared_stride, token, h, HIDDEN: tl.constexpr,
                               SHARED: tl.constexpr):  # fmt: skip
        # The shared expert's term for rows h of one token, fp32: its output rows weighted by the gate that the
        # gate_up kernel stored (SHARED == 2), or as given (SHARED == 1: already gated). Loaded before the
        # program's arithmetic (its latency hidden), added to the routed sum last (SHARED > 0 only)
        term = tl.load(shared_ptr + token.to(tl.int64) * shared_stride + h, mask=h < HIDDEN, other=0.0)
        term = term.to(tl.float32)
        if SHARED == 2:
            term = tl.load(gate_ptr + token) * term
        return term

    @triton.jit
    def _quant_moe_gate_up_kernel(
        x_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        ids_ptr,
        weights_ptr,
        act_ptr,
        score_ptr,
        gate_ptr,
        x_stride,
        codes_stride,
        high_stride,
        scales_stride,
        HIDDEN: tl.constexpr,
        INTER: tl.constexpr,
        TOP_K: tl.constexpr,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        GROUPS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        SHARED_GATE: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (T * TOP_K, cdiv(INTER, BLOCK_N)): act[pair, r] = w * silu(gate_r . x) * (up_r . x) for BLOCK_N
        # rows r of the pair's expert e, whose gate row is row e * 2 * INTER + r of the stacked [E * 2I, H]
        # weight and its up row e * 2 * INTER + INTER + r. GROUPS: K_pad / GROUP of that weight. SHARED_GATE:
        # the token's first program also stores the shared expert's gate (``_quant_moe_shared_gate``).
        # PDL: the rows hang on the routed expert ids (a predecessor's), so nothing of the weight is read early
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        pair = tl.program_id(0)
        token = pair // TOP_K
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        r = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        r_c = tl.minimum(r, INTER - 1).to(tl.int64)
        gate_rows = expert * (2 * INTER) + r_c
        up_rows = gate_rows + INTER
        x_row = x_ptr + token.to(tl.int64) * x_stride
        gate = tl.zeros([BLOCK_N], dtype=tl.float32)
        up = tl.zeros([BLOCK_N], dtype=tl.float32)
        for g in tl.range(0, GROUPS, num_stages=NUM_STAGES):
            gate += _group_dot(codes_ptr, high_ptr, scales_ptr, gate_rows, codes_stride, high_stride,
                               scales_stride, x_row, HIDDEN, g, BITS, GROUP)  # fmt: skip
            up += _group_dot(codes_ptr, high_ptr, scales_ptr, up_rows, codes_stride, high_stride,
                             scales_stride, x_row, HIDDEN, g, BITS, GROUP)  # fmt: skip
        w = tl.load(weights_ptr + pair).to(tl.float32)
        act = w * gate / (1.0 + tl.exp(-gate)) * up
        tl.store(act_ptr + pair.to(tl.int64) * INTER + r, act, mask=r < INTER)
        if SHARED_GATE:
            _quant_moe_shared_gate(x_row, score_ptr, gate_ptr, pair, TOP_K, HIDDEN)

    @triton.jit
    def _quant_moe_down_kernel(
        act_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        ids_ptr,
        out_ptr,
        shared_ptr,
        gate_ptr,
        codes_stride,
        high_stride,
        scales_stride,
        shared_stride,
        HIDDEN: tl.constexpr,
        INTER: tl.constexpr,
        TOP_K: tl.constexpr,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        GROUPS: tl.constexpr,
        BLOCK_H: tl.constexpr,
        SHARED: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (T, cdiv(HIDDEN, BLOCK_H)): out[t, h] = sum over k = 0 .. TOP_K - 1 (in that order) of
        # down_{e_k}[h] . act[t, k] for BLOCK_H output rows h, then (SHARED > 0) the shared expert's term
        # (``_quant_moe_shared_term``), one rounding; expert e's down row h is row e * HIDDEN + h of the stacked
        # [E * H, I] weight. GROUPS: K_pad / GROUP of that weight.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        token = tl.program_id(0)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        h_c = tl.minimum(h, HIDDEN - 1).to(tl.int64)
        if SHARED > 0:
            term = _quant_moe_shared_term(shared_ptr, gate_ptr, shared_stride, token, h, HIDDEN, SHARED)
        acc = tl.zeros([BLOCK_H], dtype=tl.float32)
        for k in tl.static_range(TOP_K):
            pair = token * TOP_K + k
            expert = tl.load(ids_ptr + pair).to(tl.int64)
            rows = expert * HIDDEN + h_c
            act_row = act_ptr + pair.to(tl.int64) * INTER
            for g in tl.range(0, GROUPS):
                acc += _group_dot(codes_ptr, high_ptr, scales_ptr, rows, codes_stride, high_stride, scales_stride,
                                  act_row, INTER, g, BITS, GROUP)  # fmt: skip
        if SHARED > 0:
            acc += term
        tl.store(out_ptr + token.to(tl.int64) * HIDDEN + h, acc.to(out_ptr.dtype.element_ty), mask=h < HIDDEN)

    @triton.jit
    def _quant_dequant_group_kernel(
        codes_ptr,
        high_ptr,
        scales_ptr,
        out_ptr,
        N,
        K,
        codes_stride,
        high_stride,
        scales_stride,
        out_stride,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), K_pad / BLOCK_K): out[n, k] = code * scale rounded once to out's dtype for one
        # [BLOCK_N, BLOCK_K] tile (the prefill route that hands a dequantized slab of rows to cuBLAS)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)
        k0 = tl.program_id(1) * BLOCK_K
        w = _dequant_tile(codes_ptr, high_ptr, scales_ptr, rows_c, codes_stride, high_stride, scales_stride, k0,
                          BITS, GROUP, BLOCK_K)  # fmt: skip
        cols = k0 + tl.arange(0, BLOCK_K)
        out_ptrs = out_ptr + (rows.to(tl.int64) * out_stride)[:, None] + cols[None, :]
        tl.store(out_ptrs, w.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & (cols < K)[None, :])
