"""The v2 decode kernels of the quantized routed experts (``NINFER_QUANT_MOE=v2``; launcher and reference:
``quant_moe.py``), on the stored row-split planes (Q4/Q5/Q6/W8, the layout ``triton_group.py`` reads).

v1 (``triton_group.py``) gives a token 128 down programs, each walking its top_k experts' groups one after the
other (a chain of dependent loads), and its gate_up programs walk K group by group: at T = 1 too few bytes are
in flight to cover HBM's latency (session 10 on the H200: down 32 us, gate_up 22.6 us a call). v2 keeps v1's
grid shapes and contract (no host sync, no atomics, CUDA-graph safe, a token's programs read only that token)
and changes what a program holds:

* ``_quant_moe_gate_up_v2_kernel``, grid ``(T * top_k, cdiv(I, BLOCK_N))``: one (token, slot) pair's BLOCK_N
  gate rows and the matching up rows as one tile ``[BLOCK_N, 2, BLOCK_K / 2]`` (row, gate / up, lane pair) a chunk
  of ``BLOCK_K`` lanes of K, ``act = w * silu(gate) * up`` stored fp32 as in v1. BLOCK_N = 8: 64 programs a pair
  at I = 512, 512 a token at top_k 8.
* ``_quant_moe_down_v2_kernel``, grid ``(T, cdiv(H, BLOCK_H))``: BLOCK_H output rows of one token against ALL
  its top_k experts at once: a tile ``[BLOCK_H, top_k, BLOCK_K / 2]`` of code bytes against the token's act
  ``[top_k, BLOCK_K]`` (fp32, broadcast over the rows), so the 8 experts' loads are independent requests issued
  together instead of 8 sequential loops. BLOCK_H = 8: 256 programs a token at H = 2048.

Both unroll their K_pad / BLOCK_K chunks twice: first every chunk's loads (codes, high bits, scales, activations:
a tuple of tiles), then the arithmetic, so all of a program's bytes are requested before the first register
shuffle (``ttg.convert_layout`` through shared memory, with a barrier) that the decode needs; in the PTX every
``ld.global`` precedes the first ``bar.sync``. Activations are read as lane pairs in one word (bf16 x: int32;
fp32 act: int64, act rows padded to an even length).

Arithmetic: a group's codes times the activation times the group's scale summed in fp32 (tree order within the
group), the groups, chunks and experts then summed in a fixed order, then the shared expert's term (gated by the
fp32 gate the gate_up kernel stores: ``quant_moe.py``'s docstring), one rounding at the output. The order is a
function of the tiles, and the tiles of the geometry only (``quant_moe_tiles_v2``), never of T or of the other
tokens: a token's output is bitwise the same alone or in any batch. It is NOT bitwise v1's (v1 sums groups and
experts sequentially); both match ``quant_moe_experts_ref`` within the same tolerance.
"""

from __future__ import annotations

from kernels._dispatch import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait
    from kernels.quant.triton_group import (
        _nibble_values,
        _quant_moe_shared_gate,
        _quant_moe_shared_term,
        _w8_values,
    )

    @triton.jit
    def _chunk_values(ca, cb, BITS: tl.constexpr, A: tl.constexpr, B: tl.constexpr, PAIRS: tl.constexpr,
                      HIGH: tl.constexpr):  # fmt: skip
        # a chunk's code bytes [A, B, PAIRS] (and cb: Q5/Q6's high bytes [A, B, HIGH], W8's odd lanes) -> the even
        # and odd lanes' signed codes as fp32 [A, B, PAIRS] (Q4 elementwise, no reshape)
        if BITS == 8:
            ev = _w8_values(ca)
            od = _w8_values(cb)
        elif BITS == 4:
            ev, od = _nibble_values(ca.to(tl.int32), ca.to(tl.int32), BITS)
        else:
            ev, od = _nibble_values(
                tl.reshape(ca.to(tl.int32), [A * B, PAIRS]), tl.reshape(cb.to(tl.int32), [A * B, HIGH]), BITS
            )
            ev = tl.reshape(ev, [A, B, PAIRS])
            od = tl.reshape(od, [A, B, PAIRS])
        return ev, od

    @triton.jit
    def _bf16_pairs(w):
        # int32 words holding two bf16 (the even lane in the low half) -> (even, odd) fp32, exactly
        return (w << 16).to(tl.float32, bitcast=True), (w & -65536).to(tl.float32, bitcast=True)

    @triton.jit
    def _f32_pairs(w):
        # int64 words holding two fp32 (the even lane in the low half) -> (even, odd) fp32
        even = (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
        return even, (w >> 32).to(tl.int32).to(tl.float32, bitcast=True)

    @triton.jit
    def _quant_moe_gate_up_v2_kernel(
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
        ACT_STRIDE: tl.constexpr,
        TOP_K: tl.constexpr,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        K_PAD: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        X_PAIRS: tl.constexpr,
        SHARED_GATE: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (T * TOP_K, cdiv(INTER, BLOCK_N)): act[pair, r] = w * silu(gate_r . x) * (up_r . x) for BLOCK_N
        # rows r of the pair's expert e (gate row e * 2 * INTER + r of the stacked [E * 2I, H] weight, up row
        # e * 2 * INTER + INTER + r), K_PAD / BLOCK_K chunks of BLOCK_K lanes unrolled (BLOCK_K | K_PAD), every
        # chunk's loads first (a tuple of tiles), then the arithmetic; tile
        # [BLOCK_N, 2, BLOCK_K / 2] (row, gate / up, lane pair). X_PAIRS: x is bf16 with 4-byte aligned rows, read
        # as int32 lane pairs (no even / odd shuffle through shared memory). SHARED_GATE: the token's first
        # program also stores the shared expert's gate (v1's ``_quant_moe_shared_gate``), after its act.
        PAIRS: tl.constexpr = BLOCK_K // 2
        HIGH: tl.constexpr = PAIRS * (BITS - 4) // 4  # high bytes a row a chunk (Q5, Q6)
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        # PDL: the rows hang on the routed expert ids (a predecessor's), so nothing of the weight is read early
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        pair = tl.program_id(0)
        token = pair // TOP_K
        expert = tl.load(ids_ptr + pair).to(tl.int64)
        r = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
        gate_rows = expert * (2 * INTER) + tl.minimum(r, INTER - 1).to(tl.int64)
        rows = gate_rows[:, None] + (tl.arange(0, 2) * INTER)[None, :]  # [BLOCK_N, 2]: gate, up
        code_rows = rows * codes_stride
        high_rows = rows * high_stride
        scale_rows = (rows * scales_stride)[:, :, None, None]
        x_row = x_ptr + token.to(tl.int64) * x_stride
        acc = tl.zeros([BLOCK_N, 2], dtype=tl.float32)
        loaded = ()
        for c in tl.static_range(K_PAD // BLOCK_K):  # every chunk's loads, issued before any arithmetic
            j = c * PAIRS + tl.arange(0, PAIRS)  # lane pairs (2j, 2j + 1)
            if X_PAIRS:
                xa = tl.load(x_row.to(tl.pointer_type(tl.int32)) + j, mask=2 * j < HIDDEN, other=0)
                xb = xa
            else:
                xa = tl.load(x_row + 2 * j, mask=2 * j < HIDDEN, other=0.0)
                xb = tl.load(x_row + 2 * j + 1, mask=2 * j + 1 < HIDDEN, other=0.0)
            if BITS == 8:  # even and odd lanes' codes
                ca = tl.load(codes_ptr + code_rows[:, :, None] + (2 * j)[None, None, :])
                cb = tl.load(codes_ptr + code_rows[:, :, None] + (2 * j + 1)[None, None, :])
            else:  # code bytes and high bytes
                ca = tl.load(codes_ptr + code_rows[:, :, None] + j[None, None, :])
                cb = ca  # unused for Q4
                if BITS != 4:
                    cb = tl.load(
                        high_ptr + high_rows[:, :, None] + (c * HIGH + tl.arange(0, HIGH))[None, None, :]
                    )
            g = c * GROUPS + tl.arange(0, GROUPS)
            s = tl.load(scales_ptr + scale_rows + g[None, None, :, None])  # [BLOCK_N, 2, GROUPS, 1]
            loaded = loaded + ((xa, xb, ca, cb, s),)
        for c in tl.static_range(K_PAD // BLOCK_K):
            xa, xb, ca, cb, s = loaded[c]
            if X_PAIRS:
                xe, xo = _bf16_pairs(xa)
            else:
                xe = xa.to(tl.float32)
                xo = xb.to(tl.float32)
            ev, od = _chunk_values(ca, cb, BITS, BLOCK_N, 2, PAIRS, HIGH)
            prod = tl.reshape(
                ev * xe[None, None, :] + od * xo[None, None, :], [BLOCK_N, 2, GROUPS, GROUP // 2]
            )
            acc += tl.sum(tl.sum(prod * s.to(tl.float32), axis=3), axis=2)
        gate, up = tl.split(acc)
        w = tl.load(weights_ptr + pair).to(tl.float32)
        act = w * gate / (1.0 + tl.exp(-gate)) * up
        tl.store(act_ptr + pair.to(tl.int64) * ACT_STRIDE + r, act, mask=r < INTER)
        if SHARED_GATE:
            _quant_moe_shared_gate(x_row, score_ptr, gate_ptr, pair, TOP_K, HIDDEN)

    @triton.jit
    def _quant_moe_down_v2_kernel(
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
        ACT_STRIDE: tl.constexpr,
        TOP_K: tl.constexpr,
        BLOCK_TOPK: tl.constexpr,
        BITS: tl.constexpr,
        GROUP: tl.constexpr,
        K_PAD: tl.constexpr,
        BLOCK_H: tl.constexpr,
        BLOCK_K: tl.constexpr,
        SHARED: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (T, cdiv(HIDDEN, BLOCK_H)): out[t, h] = sum over the token's TOP_K experts e_k of down_{e_k}[h] .
        # act[t, k] for BLOCK_H rows h (expert e's row h: row e * HIDDEN + h of the stacked [E * H, I] weight).
        # Every chunk's loads first (a tuple of tiles), then the arithmetic. Each chunk of BLOCK_K lanes is one
        # tile [BLOCK_H, BLOCK_TOPK, BLOCK_K / 2] of code bytes (the last
        # axis contiguous in memory: vector loads) against the act's lane pairs (int64 words: ACT_STRIDE is even);
        # slots k >= TOP_K (BLOCK_TOPK = next power of 2) read slot TOP_K - 1's rows against a zero act.
        # Sums: a group's lanes, the groups, then the experts, then (SHARED > 0) the shared expert's term (v1's
        # ``_quant_moe_shared_term``, loaded first), one rounding.
        PAIRS: tl.constexpr = BLOCK_K // 2  # lane pairs (code bytes for Q4/Q5/Q6) an expert a chunk
        HIGH: tl.constexpr = PAIRS * (BITS - 4) // 4  # high bytes an expert a chunk (Q5, Q6)
        GROUPS: tl.constexpr = BLOCK_K // GROUP
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        token = tl.program_id(0)
        h = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
        h_c = tl.minimum(h, HIDDEN - 1).to(tl.int64)[:, None]
        ks = tl.arange(0, BLOCK_TOPK)
        pairs = token * TOP_K + tl.minimum(ks, TOP_K - 1)
        rows = h_c + (tl.load(ids_ptr + pairs).to(tl.int64) * HIDDEN)[None, :]  # [BLOCK_H, BLOCK_TOPK]
        code_rows = (rows * codes_stride)[:, :, None]
        high_rows = (rows * high_stride)[:, :, None]
        scale_rows = (rows * scales_stride)[:, :, None, None]
        act_rows = act_ptr.to(tl.pointer_type(tl.int64)) + (pairs.to(tl.int64) * (ACT_STRIDE // 2))[:, None]
        live = (ks < TOP_K)[:, None]
        if SHARED > 0:  # loaded with the others
            term = _quant_moe_shared_term(shared_ptr, gate_ptr, shared_stride, token, h, HIDDEN, SHARED)
        acc = tl.zeros([BLOCK_H, BLOCK_TOPK], dtype=tl.float32)
        loaded = ()
        for c in tl.static_range(K_PAD // BLOCK_K):  # every chunk's loads, issued before any arithmetic
            j = c * PAIRS + tl.arange(0, PAIRS)  # lane pairs (2j, 2j + 1)
            a = tl.load(act_rows + j[None, :], mask=live & (2 * j < INTER)[None, :], other=0)
            if BITS == 8:  # even and odd lanes' codes
                ca = tl.load(codes_ptr + code_rows + (2 * j)[None, None, :])
                cb = tl.load(codes_ptr + code_rows + (2 * j + 1)[None, None, :])
            else:  # code bytes and high bytes
                ca = tl.load(codes_ptr + code_rows + j[None, None, :])
                cb = ca  # unused for Q4
                if BITS != 4:
                    cb = tl.load(high_ptr + high_rows + (c * HIGH + tl.arange(0, HIGH))[None, None, :])
            g = c * GROUPS + tl.arange(0, GROUPS)
            s = tl.load(scales_ptr + scale_rows + g[None, None, :, None])  # [BLOCK_H, BLOCK_TOPK, GROUPS, 1]
            loaded = loaded + ((a, ca, cb, s),)
        for c in tl.static_range(K_PAD // BLOCK_K):
            a, ca, cb, s = loaded[c]
            ae, ao = _f32_pairs(a)
            if INTER % 2 == 1:  # the last pair's odd lane is the row's padding
                ao = tl.where((2 * (c * PAIRS + tl.arange(0, PAIRS)) + 1 < INTER)[None, :], ao, 0.0)
            ev, od = _chunk_values(ca, cb, BITS, BLOCK_H, BLOCK_TOPK, PAIRS, HIGH)
            prod = ev * ae[None, :, :] + od * ao[None, :, :]
            prod = tl.reshape(prod, [BLOCK_H, BLOCK_TOPK, GROUPS, GROUP // 2])
            acc += tl.sum(tl.sum(prod * s.to(tl.float32), axis=3), axis=2)
        out = tl.sum(acc, axis=1)
        if SHARED > 0:
            out += term
        tl.store(out_ptr + token.to(tl.int64) * HIDDEN + h, out.to(out_ptr.dtype.element_ty), mask=h < HIDDEN)
