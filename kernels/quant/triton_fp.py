"""Triton kernels of the linear layer on the floating-point quantized weights: NVFP4 (E2M1 codes, swizzled
E4M3 block scales, FP32 divisor) and FP8 rows (E4M3 codes, BF16 row scales), A16: a weight-streaming GEMV for
decode and a dequantize-then-``tl.dot`` GEMM for prefill. Launchers and references: ``quant_linear.py``.

The weight is decoded in registers from the payload's planes and is exact in bf16: an E2M1 value times an
E4M3 scale has at most 6 significant bits and lies in [2^-10, 2688]; an E4M3 value has 4. So the dots see
the represented weight itself (times d_w for NVFP4), and the per-tensor divisor (NVFP4) or the row scale
(FP8) multiplies the fp32 accumulator once at the end.

Grids and batch invariance as the groupwise kernels (``triton_group.py``): the GEMVs, grid
``(cdiv(N, BLOCK_N), SPLIT_K)``, compute ``out^T [BLOCK_N, 16]`` with x's T <= 8 rows as the dot's columns
(NVFP4's nibbles interleaved back into K order in registers, so x's tile is one contiguous load); the GEMMs, grid
``(cdiv(N, BLOCK_N), cdiv(T, BLOCK_T))``, ``out^T [BLOCK_N, BLOCK_T]`` with the decoded weight tile as the
dot's A operand. NVFP4 scale ``[n, b]`` is byte ``(n // 128) * tile_stride + (b // 4) * 512 + (n % 32) * 16 +
(n % 128 // 32) * 4 + b % 4`` of the scale plane (``tile_stride`` = K / 64 * 512 for the whole plane).
"""

from __future__ import annotations

from kernels._dispatch import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait

    @triton.jit
    def _e2m1(code):
        # E2M1 word (int32, 0..15) -> float32 value: its sign, exponent and mantissa bits placed in a binary16's
        # (sign bit 15, exponent and mantissa bits 12..9) make 2^-14 times the value (E2M1's exponent bias is 1,
        # binary16's 15; E2M1's subnormal 0.5 maps to binary16's 2^-15), so two bit operations, one conversion
        # and an exact multiply
        bits = ((code & 8) << 12) | ((code & 7) << 9)
        return bits.to(tl.int16).to(tl.float16, bitcast=True).to(tl.float32) * 16384.0

    @triton.jit
    def _small_to_bf16(v):
        # float32 values with at most 8 significant bits (here E2M1 x E4M3 products) -> bf16, exactly: the high
        # half of each float32's bits (the low half is zero), integer shifts instead of F2F conversions
        return (v.to(tl.int32, bitcast=True) >> 16).to(tl.int16).to(tl.bfloat16, bitcast=True)

    @triton.jit
    def _nvfp4_scales(scales_ptr, rows_c, tile_stride, block0, BLOCKS: tl.constexpr):
        # the E4M3 scales (float32 [rows, BLOCKS]) of scale blocks [block0, block0 + BLOCKS) of rows rows_c
        b = block0 + tl.arange(0, BLOCKS)
        inner = rows_c % 128
        offs = (rows_c // 128 * tile_stride + (inner % 32) * 16 + (inner // 32) * 4)[:, None] + (
            (b // 4) * 512 + b % 4
        )[None, :]
        words = tl.load(scales_ptr + offs)
        return words.to(tl.float8e4nv, bitcast=True).to(tl.float32)

    @triton.jit
    def _quant_gemv_nvfp4_kernel(
        x_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        N,
        T,
        x_stride,
        codes_stride,
        tile_stride,
        divisor,
        K_SPLIT: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), SPLIT_K): out^T [BLOCK_N, 16] over the K_SPLIT columns of split program_id(1),
        # BLOCK_K columns (BLOCK_K / 2 code bytes, BLOCK_K / 16 scales) a step; K_SPLIT is a multiple of BLOCK_K.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        BLOCK_T: tl.constexpr = 16
        BYTES: tl.constexpr = BLOCK_K // 2
        BLOCKS: tl.constexpr = BLOCK_K // 16
        dtype = x_ptr.dtype.element_ty
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)
        ts = tl.arange(0, BLOCK_T)
        t_mask = (ts < T)[None, :]
        x_rows = ts[None, :].to(tl.int64) * x_stride
        i = tl.arange(0, BYTES)
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        k_base = tl.program_id(1) * K_SPLIT
        for k0 in tl.range(0, K_SPLIT, BLOCK_K, num_stages=NUM_STAGES):
            k = k_base + k0
            c = tl.load(codes_ptr + (rows_c * codes_stride)[:, None] + (k // 2 + i)[None, :]).to(tl.int32)
            v = tl.interleave(_e2m1(c & 15), _e2m1(c >> 4))  # [BLOCK_N, BLOCK_K] in K order
            s = _nvfp4_scales(scales_ptr, rows_c, tile_stride, k // 16, BLOCKS)
            s = tl.reshape(tl.broadcast_to(s[:, :, None], [BLOCK_N, BLOCKS, 16]), [BLOCK_N, BLOCK_K])
            cols = k + tl.arange(0, BLOCK_K)
            xt = tl.load(x_ptr + x_rows + cols[:, None], mask=t_mask, other=0.0)
            if dtype == tl.bfloat16:
                acc = tl.dot(_small_to_bf16(v * s), xt, acc)
            else:
                acc = tl.dot((v * s).to(dtype), xt, acc)
        acc = acc / divisor
        out_ptrs = out_ptr + tl.program_id(1) * (T * N) + ts[None, :] * N + rows[:, None]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & t_mask)

    @triton.jit
    def _quant_gemm_nvfp4_kernel(
        x_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        N,
        T,
        x_stride,
        codes_stride,
        tile_stride,
        divisor,
        K: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), cdiv(T, BLOCK_T)): out^T [BLOCK_N, BLOCK_T], the decoded weight tile
        # [BLOCK_N, BLOCK_K] (codes interleaved back into K order, times the block scale: exact) as A.
        BYTES: tl.constexpr = BLOCK_K // 2
        BLOCKS: tl.constexpr = BLOCK_K // 16
        dtype = x_ptr.dtype.element_ty
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)
        ts = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_mask = (ts < T)[None, :]
        x_rows = ts[None, :].to(tl.int64) * x_stride
        i = tl.arange(0, BYTES)
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            c = tl.load(codes_ptr + (rows_c * codes_stride)[:, None] + (k0 // 2 + i)[None, :]).to(tl.int32)
            v = tl.interleave(_e2m1(c & 15), _e2m1(c >> 4))  # [BLOCK_N, BLOCK_K]
            s = _nvfp4_scales(scales_ptr, rows_c, tile_stride, k0 // 16, BLOCKS)
            s = tl.reshape(tl.broadcast_to(s[:, :, None], [BLOCK_N, BLOCKS, 16]), [BLOCK_N, BLOCK_K])
            cols = k0 + tl.arange(0, BLOCK_K)
            xt = tl.load(x_ptr + x_rows + cols[:, None], mask=t_mask, other=0.0)
            acc = tl.dot((v * s).to(dtype), xt, acc)
        acc = acc / divisor
        out_ptrs = out_ptr + ts[None, :].to(tl.int64) * N + rows[:, None]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & t_mask)

    @triton.jit
    def _quant_gemv_fp8_kernel(
        x_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        N,
        T,
        x_stride,
        codes_stride,
        K_SPLIT: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), SPLIT_K): out^T [BLOCK_N, 16] over the K_SPLIT columns of split program_id(1);
        # only an unsplit K ends in a partial step. The row scale multiplies each split's sum.
        pdl_wait(PDL)  # kernels/pdl.py: before any read of a predecessor's output or any write
        pdl_launch_dependents(PDL)
        BLOCK_T: tl.constexpr = 16
        EVEN_K: tl.constexpr = K_SPLIT % BLOCK_K == 0
        dtype = x_ptr.dtype.element_ty
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)
        ts = tl.arange(0, BLOCK_T)
        t_mask = (ts < T)[None, :]
        cols = tl.arange(0, BLOCK_K)
        k_base = tl.program_id(1) * K_SPLIT
        w_ptrs = codes_ptr + (rows_c * codes_stride)[:, None] + (k_base + cols)[None, :]
        x_ptrs = x_ptr + ts[None, :].to(tl.int64) * x_stride + (k_base + cols)[:, None]
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for k0 in tl.range(0, K_SPLIT, BLOCK_K, num_stages=NUM_STAGES):
            if EVEN_K:
                c = tl.load(w_ptrs + k0)
                xt = tl.load(x_ptrs + k0, mask=t_mask, other=0.0)
            else:
                k_mask = cols < K_SPLIT - k0
                c = tl.load(w_ptrs + k0, mask=k_mask[None, :], other=0)
                xt = tl.load(x_ptrs + k0, mask=t_mask & k_mask[:, None], other=0.0)
            acc = tl.dot(c.to(tl.float8e4nv, bitcast=True).to(dtype), xt, acc)
        acc = acc * tl.load(scales_ptr + rows_c).to(tl.float32)[:, None]
        out_ptrs = out_ptr + tl.program_id(1) * (T * N) + ts[None, :] * N + rows[:, None]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & t_mask)

    @triton.jit
    def _quant_gemm_fp8_kernel(
        x_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        N,
        T,
        x_stride,
        codes_stride,
        K: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_T: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), cdiv(T, BLOCK_T)): out^T [BLOCK_N, BLOCK_T] = E4M3 tile (decoded to x's
        # dtype, exact) @ x tile^T, times the row scales at the end (A16; the A8 route is torch._scaled_mm).
        dtype = x_ptr.dtype.element_ty
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)
        ts = tl.program_id(1) * BLOCK_T + tl.arange(0, BLOCK_T)
        t_mask = (ts < T)[None, :]
        cols = tl.arange(0, BLOCK_K)
        w_ptrs = codes_ptr + (rows_c * codes_stride)[:, None] + cols[None, :]
        x_ptrs = x_ptr + ts[None, :].to(tl.int64) * x_stride + cols[:, None]
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for k0 in tl.range(0, K, BLOCK_K, num_stages=NUM_STAGES):
            k_mask = cols < K - k0
            c = tl.load(w_ptrs + k0, mask=k_mask[None, :], other=0)
            xt = tl.load(x_ptrs + k0, mask=t_mask & k_mask[:, None], other=0.0)
            acc = tl.dot(c.to(tl.float8e4nv, bitcast=True).to(dtype), xt, acc)
        acc = acc * tl.load(scales_ptr + rows_c).to(tl.float32)[:, None]
        out_ptrs = out_ptr + ts[None, :].to(tl.int64) * N + rows[:, None]
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & t_mask)

    @triton.jit
    def _quant_dequant_fp_kernel(
        codes_ptr,
        scales_ptr,
        out_ptr,
        N,
        K,
        codes_stride,
        tile_stride,
        out_stride,
        divisor,
        NVFP4: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), cdiv(K, BLOCK_K)): one [BLOCK_N, BLOCK_K] tile of the represented weight,
        # rounded once to out's dtype: NVFP4 e2m1 * e4m3 / divisor (K a multiple of BLOCK_K), or FP8 rows
        # e4m3 * row scale (scales_ptr: the bf16 row scales; tile_stride and divisor unused)
        rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
        rows_c = tl.minimum(rows, N - 1).to(tl.int64)
        k0 = tl.program_id(1) * BLOCK_K
        cols = k0 + tl.arange(0, BLOCK_K)
        if NVFP4:
            i = tl.arange(0, BLOCK_K // 2)
            c = tl.load(codes_ptr + (rows_c * codes_stride)[:, None] + (k0 // 2 + i)[None, :]).to(tl.int32)
            v = tl.interleave(_e2m1(c & 15), _e2m1(c >> 4))
            s = _nvfp4_scales(scales_ptr, rows_c, tile_stride, k0 // 16, BLOCK_K // 16)
            s = tl.reshape(tl.broadcast_to(s[:, :, None], [BLOCK_N, BLOCK_K // 16, 16]), [BLOCK_N, BLOCK_K])
            w = v * s / divisor
        else:
            c = tl.load(
                codes_ptr + (rows_c * codes_stride)[:, None] + cols[None, :],
                mask=(cols < K)[None, :],
                other=0,
            )
            w = (
                c.to(tl.float8e4nv, bitcast=True).to(tl.float32)
                * tl.load(scales_ptr + rows_c).to(tl.float32)[:, None]
            )
        out_ptrs = out_ptr + (rows.to(tl.int64) * out_stride)[:, None] + cols[None, :]
        tl.store(out_ptrs, w.to(out_ptr.dtype.element_ty), mask=(rows < N)[:, None] & (cols < K)[None, :])
