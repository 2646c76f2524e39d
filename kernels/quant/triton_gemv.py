"""The decode GEMV of the row-split groupwise formats (Q4/Q5/Q6/W8) on the GEMV layout (``kernels.quant.repack``),
and the dequantize kernel of that layout (the prefill route's bf16 slabs). Launchers: ``quant_linear.py``;
reference: ``quant_linear_ref``.

``_quant_gemv_packed_kernel``, grid ``(cdiv(N, BLOCK_N), SPLIT_K)``: a program owns ``BLOCK_N`` weight rows and
``UNITS_SPLIT`` consecutive units of 128 lanes (its split of K) and walks them ``STEP_UNITS`` at a time, the next
step's words (and high bits, scales) loaded before the current step is computed (a register prefetch: two
steps of weight bytes in flight a program without relying on the compiler's pipeliner). A unit of a row is
one contiguous run of 64 (Q4), 64 + 16 (Q5), 64 + 32 (Q6) or 128 (W8) bytes: each thread reads 16-byte vectors
of it and a warp's loads cover whole rows' runs (coalesced).

Dequantization is word-wide bit operations in registers (no shift-and-convert per element). Q4/Q5/Q6: for
pair plane s, ``(w >> 4s) & 0x000F000F | MAGIC`` (one SHF and one LOP3; the high bits, pre-spread once a unit,
OR-ed in by one more shift and LOP3) is two 16-bit floats of the K-adjacent lanes ``32s + 2i``, ``32s + 2i + 1``
whose values are ``M + u`` exactly (``MAGIC``: the bits of ``M`` = 128 in bf16, 1024 in fp16, twice; ``u =
code + OFFSET`` < 128), then one packed ``fma.rn.bf16x2`` (``f16x2``) ``* 1 - (M + OFFSET)`` makes them the
codes themselves (exact): ~1.5 instructions a lane, and the word is already the packed pair a tensor-core
operand register holds. ``ASM`` (constexpr) selects this inline PTX (``lop3.b32``, ``fma.rn.*x2``) on a GPU;
the interpreter (no inline asm) computes the same exact values through fp32. W8: each byte through the
float32 magic ``2^23 + u`` minus ``2^23 + 128`` (exact), converted to x's dtype (exact: <= 8 significant
bits). Measured statically (sm_90 SASS of the loop, 128 rows a program, 4 warps): 2.7 (Q4), 3.9 (Q5), 4.1
(Q6) instructions a lane, against ~4.4 / 5.4 / 6.5 issue slots a lane that 80% of 4.8 TB/s leaves.

``MODE`` (constexpr): ``0`` tensor cores: pair plane s is a [BLOCK_N, 32] operand of a ``tl.dot`` with x's
matching [32 lanes, 16] tile (x's T <= 8 rows as the dot's 16 columns; rows past T read row T - 1 and are
not stored, so no mask), fp32 accumulation, each group's fp32 scale applied to its two dots' sum; T is no
compile-time constant and the tiles depend on N and K only, so a row's output is bitwise the same in any
batch. ``1`` CUDA cores for one row of x (T = 1 only; a tile variant for comparison): the codes widened to
fp32 times x's slice into a [BLOCK_N, 32] fp32 accumulator reduced at the end. ``EVEN_K`` (K a multiple of
128, every real geometry): no lane masks on x. Split K: fp32 partials ``[SPLIT_K, T, N]`` summed in split
order by ``kernels.linear._linear_reduce_kernel``.
"""

from __future__ import annotations

from kernels._dispatch import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait

    @triton.jit
    def _packed_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows, unit,
                     BITS: tl.constexpr, WORDS: tl.constexpr, GROUPS: tl.constexpr):  # fmt: skip
        # one unit of the program's rows: the code words (int32 [rows, WORDS]), the high bits spread for
        # _pair (int32 [rows, 16]; the words again for Q4/W8, unused) and the unit's fp32 scales, [rows, 1]
        # each (4 groups a unit for W8, else 2; the unused ones repeat the first)
        i = tl.arange(0, WORDS)
        w = tl.load(codes_ptr + code_rows + (unit * WORDS + i)[None, :])
        g = w
        if BITS == 5:  # byte i: bit j -> bit 4 of plane j; spread: bits 0..7 and a copy at 12..19
            # read as 4 words a row and split into bytes in registers (the thread holding words i..i+3 holds
            # their high bytes in one word: no layout conversion against the code words)
            q = tl.arange(0, 4)
            h4 = tl.load(high_ptr + high_rows + (unit * 4 + q)[None, :])
            h = tl.reshape((h4[:, :, None] >> (8 * q)[None, None, :]) & 0xFF, [h4.shape[0], 16])
            g = h | (h << 12)
        if (
            BITS == 6
        ):  # 16-bit word i: bits 2j, 2j+1 -> bits 4, 5 of plane j; spread: byte 1 moved to bits 16..23
            h = tl.load(high_ptr + high_rows + (unit * 16 + i)[None, :]).to(tl.int32) & 0xFFFF
            g = (h & 0xFF) | ((h & 0xFF00) << 8)
        s0 = tl.load(scales_ptr + scale_rows + unit * GROUPS).to(tl.float32)
        s1 = tl.load(scales_ptr + scale_rows + unit * GROUPS + 1).to(tl.float32)
        s2 = s0
        s3 = s0
        if GROUPS == 4:
            s2 = tl.load(scales_ptr + scale_rows + unit * GROUPS + 2).to(tl.float32)
            s3 = tl.load(scales_ptr + scale_rows + unit * GROUPS + 3).to(tl.float32)
        return w, g, s0, s1, s2, s3

    @triton.jit
    def _and_or(a, MASK: tl.constexpr, c, ASM: tl.constexpr):
        # (a & MASK) | c: one LOP3 with ASM (ptxas makes two of the plain form when c is a constant)
        if ASM:
            return tl.inline_asm_elementwise(
                f"lop3.b32 $0, $1, {MASK}, $2, 0xEA;", "=r,r,r", [a, c], dtype=tl.int32, is_pure=True, pack=1
            )
        return (a & MASK) | c

    @triton.jit
    def _pair(w, g, s: tl.constexpr, BITS: tl.constexpr, MAGIC: tl.constexpr, ASM: tl.constexpr):
        # pair plane s of a Q4/Q5/Q6 word tile: lanes 32s + 2i (low half) and 32s + 2i + 1 (high half) of word i
        # as 16-bit float bits of M + u
        c = tl.full(w.shape, MAGIC, tl.int32)
        if BITS == 5:
            c = _and_or(g << (4 - s), 0x00100010, c, ASM)
        if BITS == 6:
            if s == 3:
                c = _and_or(g >> 2, 0x00300030, c, ASM)
            else:
                c = _and_or(g << (4 - 2 * s), 0x00300030, c, ASM)
        return _and_or(w >> (4 * s), 0x000F000F, c, ASM)

    @triton.jit
    def _pair_codes(t, SUB: tl.constexpr, FMA_ONE: tl.constexpr, FMA_NEG: tl.constexpr, dtype: tl.constexpr,
                    ASM: tl.constexpr):  # fmt: skip
        # the pair words (bits of M + u) -> the codes u - OFFSET = M + u - SUB in dtype, [rows, 32] in K order
        # (each word's halves side by side). ASM (a GPU): one packed fma a word, w * 1 + (-SUB) (exact), the
        # halves as they are; else (the interpreter) the same numbers through fp32 (the bf16 magic only there)
        if ASM:
            if dtype == tl.float16:
                c = tl.inline_asm_elementwise(
                    "fma.rn.f16x2 $0, $1, $2, $3;", "=r,r,r,r",
                    [t, tl.full(t.shape, FMA_ONE, tl.int32), tl.full(t.shape, FMA_NEG, tl.int32)],
                    dtype=tl.int32, is_pure=True, pack=1,
                )  # fmt: skip
            else:
                c = tl.inline_asm_elementwise(
                    "fma.rn.bf16x2 $0, $1, $2, $3;", "=r,r,r,r",
                    [t, tl.full(t.shape, FMA_ONE, tl.int32), tl.full(t.shape, FMA_NEG, tl.int32)],
                    dtype=tl.int32, is_pure=True, pack=1,
                )  # fmt: skip
            lo = c.to(tl.int16).to(dtype, bitcast=True)
            hi = (c >> 16).to(tl.int16).to(dtype, bitcast=True)
        else:
            lo = ((t << 16).to(tl.float32, bitcast=True) - SUB).to(dtype)
            hi = ((t & -65536).to(tl.float32, bitcast=True) - SUB).to(dtype)
        return tl.reshape(tl.join(lo, hi), [t.shape[0], 2 * t.shape[1]])

    @triton.jit
    def _x_tile(x_ptr, x_rows, col, K, EVEN_K: tl.constexpr):
        # x's [lanes, 16] tile at columns col (x's rows clamped to T - 1 already: no row mask)
        if EVEN_K:
            return tl.load(x_ptr + x_rows + col[:, None])
        return tl.load(x_ptr + x_rows + col[:, None], mask=(col < K)[:, None], other=0.0)

    @triton.jit
    def _unit_dot(acc, w, g, s0, s1, s2, s3, x_ptr, x_rows, k0, K, BITS: tl.constexpr, MAGIC: tl.constexpr,
                  SUB: tl.constexpr, FMA_ONE: tl.constexpr, FMA_NEG: tl.constexpr, dtype: tl.constexpr,
                  ASM: tl.constexpr, EVEN_K: tl.constexpr):  # fmt: skip
        # acc [BLOCK_N, 16] += this unit's contribution, on the tensor cores (MODE 0)
        lanes = tl.arange(0, 32)
        if BITS == 8:
            for j in tl.static_range(4):
                b = ((w >> (8 * j)) & 0xFF) | 0x4B000000
                a = (b.to(tl.float32, bitcast=True) - 8388736.0).to(dtype)  # 2^23 + u - (2^23 + 128): exact
                xt = _x_tile(x_ptr, x_rows, k0 + 32 * j + lanes, K, EVEN_K)
                sj = s0 if j == 0 else s1 if j == 1 else s2 if j == 2 else s3
                acc += tl.dot(a, xt) * sj
        else:
            for half in tl.static_range(2):
                a0 = _pair_codes(_pair(w, g, 2 * half, BITS, MAGIC, ASM), SUB, FMA_ONE, FMA_NEG, dtype, ASM)
                a1 = _pair_codes(
                    _pair(w, g, 2 * half + 1, BITS, MAGIC, ASM), SUB, FMA_ONE, FMA_NEG, dtype, ASM
                )
                d = tl.dot(a0, _x_tile(x_ptr, x_rows, k0 + 64 * half + lanes, K, EVEN_K))
                d = tl.dot(a1, _x_tile(x_ptr, x_rows, k0 + 64 * half + 32 + lanes, K, EVEN_K), d)
                acc += d * (s0 if half == 0 else s1)
        return acc

    @triton.jit
    def _x_vector(x_ptr, col, K, EVEN_K: tl.constexpr):
        if EVEN_K:
            return tl.load(x_ptr + col).to(tl.float32)
        return tl.load(x_ptr + col, mask=col < K, other=0.0).to(tl.float32)

    @triton.jit
    def _unit_fma(acc, w, g, s0, s1, s2, s3, x_ptr, k0, K, BITS: tl.constexpr, MAGIC: tl.constexpr,
                  SUB: tl.constexpr, FMA_ONE: tl.constexpr, FMA_NEG: tl.constexpr, ASM: tl.constexpr,
                  EVEN_K: tl.constexpr):  # fmt: skip
        # one row of x (MODE 1): acc [BLOCK_N, 32] += fp32 products of this unit (CUDA cores)
        lanes = tl.arange(0, 32)
        if BITS == 8:
            for j in tl.static_range(4):
                a = (((w >> (8 * j)) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
                sj = s0 if j == 0 else s1 if j == 1 else s2 if j == 2 else s3
                acc += a * _x_vector(x_ptr, k0 + 32 * j + lanes, K, EVEN_K)[None, :] * sj
        else:
            for p in tl.static_range(4):
                codes = _pair_codes(_pair(w, g, p, BITS, MAGIC, ASM), SUB, FMA_ONE, FMA_NEG, tl.bfloat16, ASM)
                part = codes.to(tl.float32) * _x_vector(x_ptr, k0 + 32 * p + lanes, K, EVEN_K)[None, :]
                acc += part * (s0 if p < 2 else s1)
        return acc

    @triton.jit(do_not_specialize=["T"])  # one compile for every T (Triton would specialize T == 1)
    def _quant_gemv_packed_kernel(
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
        UNITS_SPLIT: tl.constexpr,
        STEP_UNITS: tl.constexpr,
        BLOCK_N: tl.constexpr,
        MODE: tl.constexpr,
        EVEN_K: tl.constexpr,
        ASM: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), SPLIT_K); codes_ptr: int32 words (strides in words), high_ptr: int32 (Q5) or
        # int16 (Q6) (strides in elements), scales_ptr: fp16 [N, K_pad / GROUP]. out: [T, N] in x's dtype (one
        # split) or fp32 partials [SPLIT_K, T, N]. UNITS_SPLIT is a multiple of STEP_UNITS. See the docstring.
        WORDS: tl.constexpr = 32 if BITS == 8 else 16
        GROUPS: tl.constexpr = 4 if BITS == 8 else 2
        OFFSET: tl.constexpr = 1 << (BITS - 1)
        dtype = x_ptr.dtype.element_ty
        # the 16-bit float magic (M = 1024 for fp16, 128 for bf16: M + u is exact) and the packed fma's operands
        # (1, 1) and (-(M + OFFSET), -(M + OFFSET)) as int32 bit patterns; MODE 1 and the interpreter (no ASM:
        # _pair_codes widens bf16 bits) use the bf16 ones
        F16: tl.constexpr = dtype == tl.float16 and MODE == 0 and ASM
        MAGIC: tl.constexpr = 0x64006400 if F16 else 0x43004300
        SUB: tl.constexpr = (1024.0 if F16 else 128.0) + OFFSET
        FMA_ONE: tl.constexpr = 0x3C003C00 if F16 else 0x3F803F80
        FMA_NEG: tl.constexpr = ((0xE400 if F16 else 0xC300) | OFFSET) * 65537 - 4294967296
        split = tl.program_id(1)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)  # clamped: no row mask on the loads
        code_rows = (rows_c * codes_stride)[:, None]
        high_rows = (rows_c * high_stride)[:, None]
        scale_rows = (rows_c * scales_stride)[:, None]
        ts = tl.arange(0, 16)
        x_rows = tl.minimum(ts, T - 1)[None, :].to(tl.int64) * x_stride  # clamped: no row mask on x
        if MODE == 0:
            acc = tl.zeros([BLOCK_N, 16], dtype=tl.float32)
        else:
            acc = tl.zeros([BLOCK_N, 32], dtype=tl.float32)
        u0 = split * UNITS_SPLIT
        # the split's first unit of WEIGHT planes (codes, high bits, scales: no kernel of a step writes them) is
        # loaded before pdl_wait, so under PDL it streams while the kernel before finishes (kernels/pdl.py); x and
        # every write come after the wait
        w, g, s0, s1, s2, s3 = _packed_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows,
                                            u0, BITS, WORDS, GROUPS)  # fmt: skip
        pdl_wait(PDL)
        pdl_launch_dependents(PDL)
        for step in range(0, UNITS_SPLIT, STEP_UNITS):
            for j in tl.static_range(STEP_UNITS):
                unit = u0 + step + j
                # the next unit's planes first (the last unit of the split loads itself again: no branch)
                nxt = tl.minimum(unit + 1, u0 + UNITS_SPLIT - 1)
                w_n, g_n, s0_n, s1_n, s2_n, s3_n = _packed_load(codes_ptr, high_ptr, scales_ptr, code_rows,
                                                                high_rows, scale_rows, nxt, BITS, WORDS,
                                                                GROUPS)  # fmt: skip
                if MODE == 0:
                    acc = _unit_dot(acc, w, g, s0, s1, s2, s3, x_ptr, x_rows, unit * 128, K, BITS, MAGIC, SUB,
                                    FMA_ONE, FMA_NEG, dtype, ASM, EVEN_K)  # fmt: skip
                else:
                    acc = _unit_fma(acc, w, g, s0, s1, s2, s3, x_ptr, unit * 128, K, BITS, MAGIC, SUB, FMA_ONE,
                                    FMA_NEG, ASM, EVEN_K)  # fmt: skip
                w, g, s0, s1, s2, s3 = w_n, g_n, s0_n, s1_n, s2_n, s3_n
        if MODE == 0:
            out_ptrs = out_ptr + split * (T * N) + ts[None, :] * N + rows[:, None]
            tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & (ts < T)[None, :])
        else:
            total = tl.sum(acc, axis=1)
            tl.store(out_ptr + split * N + rows, total.to(out_ptr.dtype.element_ty), mask=rows < N)

    @triton.jit
    def _quant_dequant_packed_kernel(
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
        BLOCK_N: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), K_pad / 128): one unit of BLOCK_N rows of the represented weight, code * scale
        # rounded once to out's dtype (the prefill route's slab), from the GEMV layout
        WORDS: tl.constexpr = 32 if BITS == 8 else 16
        GROUPS: tl.constexpr = 4 if BITS == 8 else 2
        OFFSET: tl.constexpr = 1 << (BITS - 1)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)
        unit = tl.program_id(1)
        w, g, s0, s1, s2, s3 = _packed_load(codes_ptr, high_ptr, scales_ptr, (rows_c * codes_stride)[:, None],
                                            (rows_c * high_stride)[:, None], (rows_c * scales_stride)[:, None],
                                            unit, BITS, WORDS, GROUPS)  # fmt: skip
        row_mask = (rows < N)[:, None]
        out_rows = out_ptr + (rows.to(tl.int64) * out_stride)[:, None]
        i = tl.arange(0, WORDS)
        if BITS == 8:
            for j in tl.static_range(4):
                a = (((w >> (8 * j)) & 0xFF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388736.0
                col = unit * 128 + 32 * j + i
                v = a * (s0 if j == 0 else s1 if j == 1 else s2 if j == 2 else s3)
                tl.store(
                    out_rows + col[None, :],
                    v.to(out_ptr.dtype.element_ty),
                    mask=row_mask & (col < K)[None, :],
                )
        else:
            lanes = tl.arange(0, 32)
            for p in tl.static_range(4):
                codes = _pair_codes(
                    _pair(w, g, p, BITS, 0x43004300, False), 128.0 + OFFSET, 0, 0, tl.bfloat16, False
                )
                col = unit * 128 + 32 * p + lanes
                v = codes.to(tl.float32) * (s0 if p < 2 else s1)
                tl.store(
                    out_rows + col[None, :],
                    v.to(out_ptr.dtype.element_ty),
                    mask=row_mask & (col < K)[None, :],
                )
