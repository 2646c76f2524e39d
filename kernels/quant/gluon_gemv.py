"""The one-row decode GEMV of the row-split groupwise formats (Q4/Q5/Q6) on the GEMV layout, written in Gluon
(Triton's explicit-layout dialect) so that nothing changes register layout inside the loop. Launcher:
``packed_linear.gemv_packed`` (tile mode ``"pairs"``); reference: ``quant_linear_ref``.

Why Gluon: the same arithmetic in plain Triton (``triton_gemv.py`` MODE 2) compiles to a shared-memory round trip
and two barriers a group: Triton's layout passes give the [BLOCK_N, 1] scale loads and the final row sums a
layout of their own and move the [BLOCK_N, 16] partial sums to it every group (seen in the sm_90 SASS: STSM,
LDS and BAR in the loop). Here every tensor is in one blocked layout ``L`` (a thread: 4 consecutive 32-bit words
of a row, one 16-byte load; 4 threads a row's 16 words; 8 rows a warp) or a slice of it: the scales are loaded
per row in ``SliceLayout(1, L)`` (the 4 threads of a row read the same two bytes), x per word in
``SliceLayout(0, L)``, and the row sums leave in ``SliceLayout(1, L)``.

Per unit of 128 lanes (``kernels.quant.repack``: word ``i`` holds lanes ``32 s + 2i`` and ``32 s + 2i + 1`` of
pair plane ``s`` in its two 16-bit halves), per pair plane: one shift and one LOP3 make the halves the bf16 bits
of ``128 + u`` (the high bits of Q5/Q6 OR-ed in from a pre-spread word), one packed ``fma.rn.bf16x2`` makes them
the codes themselves (exact), a shift and an and widen each half to fp32 in place, and two fp32 FMAs multiply
them by x's lanes, read as the 32-bit word holding the same lane pair (no join into K order). The group's sum
is scaled by one FMA a word. Grid ``(cdiv(N, BLOCK_N), SPLIT_K)``; split K writes fp32 partials
``[SPLIT_K, 1, N]`` that ``kernels.linear._linear_reduce_kernel`` sums in split order.

``_quant_gemv_fp8_rows_kernel``: the same one-row GEMV for FP8 rows (``FP8_E4M3FN_ROW_BF16S``, stored layout):
a thread's 16-byte load is 16 codes of a row, two hardware E4M3-pair conversions and four f16 widenings a word
make them exact fp32, and the row's bf16 scale multiplies its sum once. Launcher: ``quant_linear._gemv``.
"""

from __future__ import annotations

from kernels._dispatch import HAS_TRITON
from kernels.quant.mma_asm import mma_group_asm

if HAS_TRITON:
    from kernels.pdl import pdl_launch_dependents, pdl_wait

HAS_GLUON = False
if HAS_TRITON:
    try:
        from triton.experimental import gluon
        from triton.experimental.gluon import language as gl
        from triton.experimental.gluon.language.nvidia.ampere import async_copy

        HAS_GLUON = True
    except ImportError:  # a Triton without Gluon: packed_linear keeps the Triton modes
        pass


# the launcher passes the format's text as the kernel's ASM (mma_asm.py)
MMA_GROUP_ASM = {bits: mma_group_asm(bits) for bits in (4, 5, 6)}

if HAS_GLUON:

    @gluon.jit
    def _pairs_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows, unit, i,
                    BITS: gl.constexpr):  # fmt: skip
        # one unit of the program's rows, all in L: the code words [rows, 16], the high bits spread for _pairs_word
        # [rows, 16] (the words again for Q4, unused), the two groups' fp32 scales [rows] (SliceLayout(1, L))
        w = gl.load(codes_ptr + code_rows + (unit * 16 + i)[None, :])
        g = w
        if BITS == 5:  # byte i: bit j -> bit 4 of plane j; spread: bits 0..7 and a copy at 12..19
            h = gl.load(high_ptr + high_rows + (unit * 16 + i)[None, :]).to(gl.int32) & 0xFF
            g = h | (h << 12)
        if BITS == 6:  # 16-bit word i: bits 2j, 2j+1 -> bits 4, 5 of plane j; byte 1 moved to bits 16..23
            h = gl.load(high_ptr + high_rows + (unit * 16 + i)[None, :]).to(gl.int32) & 0xFFFF
            g = (h & 0xFF) | ((h & 0xFF00) << 8)
        s0 = gl.load(scales_ptr + scale_rows + unit * 2).to(gl.float32)
        s1 = gl.load(scales_ptr + scale_rows + unit * 2 + 1).to(gl.float32)
        return w, g, s0, s1

    @gluon.jit
    def _weight_step_load(w_ptr, offs, step, STRIDE: gl.constexpr):
        # one step of a WEIGHT plane (codes or scales; no kernel of a step writes them, so under PDL the first step
        # is loaded before pdl_wait): the elements at offs + step * STRIDE
        return gl.load(w_ptr + offs + step * STRIDE)

    @gluon.jit
    def _pairs_and_or(a, MASK: gl.constexpr, c):
        # (a & MASK) | c as one LOP3
        return gl.inline_asm_elementwise(
            f"lop3.b32 $0, $1, {MASK}, $2, 0xEA;", "=r,r,r", [a, c], dtype=gl.int32, is_pure=True, pack=1
        )

    @gluon.jit
    def _one_row_tile(N, BLOCK_N: gl.constexpr, COLUMNS: gl.constexpr, L: gl.constexpr):
        # a program's rows (in SliceLayout(1, L)), the same clamped for the loads (no row mask) and the word
        # columns of a step (SliceLayout(0, L))
        rows = gl.program_id(0) * BLOCK_N + gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L))
        return rows, gl.minimum(rows, N - 1).to(gl.int64), gl.arange(0, COLUMNS, layout=gl.SliceLayout(0, L))

    @gluon.jit
    def _store_rows(out_ptr, acc, scale, rows, N):
        # the rows' sums (acc [BLOCK_N, C] summed over C, times scale) to out: [N] in x's dtype (one split) or the
        # split's fp32 partials [SPLIT_K, N]
        total = gl.sum(acc, axis=1) * scale
        gl.store(out_ptr + gl.program_id(1) * N + rows, total.to(out_ptr.dtype.element_ty), mask=rows < N)

    @gluon.jit
    def _last_split(count_ptr):
        # after this program stored its split's partials: whether it is the last split of its row tile to finish
        # (then it has reset the tile's ticket counter and may read every split's partials). kernels/linear.py's
        # LAST_REDUCES pattern: a CTA barrier, a ticket at GPU scope (acq_rel), the reset, a barrier.
        gl.thread_barrier()  # every thread's partial stored before the ticket (release, GPU scope)
        tile = gl.program_id(0)
        ticket = gl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
        last = ticket == gl.num_programs(1) - 1
        if last:
            gl.store(count_ptr + tile, 0)  # the next launch starts from 0 (kernel boundaries order it)
            gl.thread_barrier()
        return last

    @gluon.jit
    def _ring_store(out_ptr, final_ptr, count_ptr, acc, scale, rows, N, LAST: gl.constexpr, L: gl.constexpr):
        # _store_rows; then (LAST: NINFER_SPLITK_REDUCE=last, K split) the row tile's last split to finish sums the
        # tile's fp32 partials in split order into final_ptr ([N] in x's dtype; bitwise _linear_reduce_kernel's)
        # and resets its ticket counter (count_ptr: kernels.linear.ticket_counters; the pattern and its
        # release/acquire as kernels/linear.py's LAST_REDUCES): no reduce launch follows
        _store_rows(out_ptr, acc, scale, rows, N)
        if LAST:
            if _last_split(count_ptr):
                total = gl.zeros(rows.shape, gl.float32, layout=gl.SliceLayout(1, L))
                for split in range(gl.num_programs(1)):
                    total += gl.load(
                        out_ptr + split * N + rows, mask=rows < N, other=0.0, cache_modifier=".cg"
                    )
                gl.store(final_ptr + rows, total.to(final_ptr.dtype.element_ty), mask=rows < N)

    @gluon.jit
    def _pairs_word(w, g, magic, s: gl.constexpr, BITS: gl.constexpr):
        # pair plane s: lanes 32s + 2i (low half) and 32s + 2i + 1 (high half) of word i as bf16 bits of 128 + u
        c = magic
        if BITS == 5:
            c = _pairs_and_or(g << (4 - s), 0x00100010, c)
        if BITS == 6:
            if s == 3:
                c = _pairs_and_or(g >> 2, 0x00300030, c)
            else:
                c = _pairs_and_or(g << (4 - 2 * s), 0x00300030, c)
        return _pairs_and_or(w >> (4 * s), 0x000F000F, c)

    @gluon.jit
    def _pairs_f32(t, one, neg):
        # bf16 pairs of 128 + u -> the codes u - OFFSET of both halves as fp32, exact (one packed fma, then each
        # half widened where it is)
        c = gl.inline_asm_elementwise(
            "fma.rn.bf16x2 $0, $1, $2, $3;", "=r,r,r,r", [t, one, neg], dtype=gl.int32, is_pure=True, pack=1
        )
        return (c << 16).to(gl.float32, bitcast=True), (c & -65536).to(gl.float32, bitcast=True)

    @gluon.jit
    def _pairs_unit(acc, w, g, s0, s1, xw_ptr, unit, i, magic, one, neg, BITS: gl.constexpr, BLOCK_N: gl.constexpr,
                    L: gl.constexpr):  # fmt: skip
        # acc [BLOCK_N, 16] += one unit's products: per group (pair planes 0-1, 2-3) the fp32 sum of its codes
        # times x's lanes, scaled once
        for half in gl.static_range(2):
            part = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
            for q in gl.static_range(2):
                lo, hi = _pairs_f32(_pairs_word(w, g, magic, 2 * half + q, BITS), one, neg)
                xw = gl.load(xw_ptr + (unit * 64 + 16 * (2 * half + q)) + i)
                xl = (xw << 16).to(gl.float32, bitcast=True)[None, :]
                xh = (xw & -65536).to(gl.float32, bitcast=True)[None, :]
                if q == 0:
                    part = lo * xl
                else:
                    part = gl.fma(lo, xl, part)
                part = gl.fma(hi, xh, part)
            scale = s0 if half == 0 else s1
            acc = gl.fma(part, scale[:, None], acc)
        return acc

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_pairs_kernel(
        xw_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        out_ptr,
        N,
        codes_stride,
        high_stride,
        scales_stride,
        BITS: gl.constexpr,
        UNITS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        STEP: gl.constexpr,  # units a loop step (1, or 2: two units' loads issued together, two a row in flight)
        PDL: gl.constexpr,
    ):
        # xw_ptr: bf16 x (one row, K a multiple of 128) as int32 lane pairs; codes_ptr: int32 words (strides in
        # words); high_ptr: uint8 (Q5) or int16 (Q6) (strides in elements; the words again for Q4); scales_ptr:
        # fp16 [N, K_pad / 64]; out: [N] in bf16 (one split) or fp32 partials [SPLIT_K, N]
        L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [NUM_WARPS, 1], [1, 0])
        OFFSET: gl.constexpr = 1 << (BITS - 1)
        split = gl.program_id(1)
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 16, L)
        code_rows = (rows_c * codes_stride)[:, None]
        high_rows = (rows_c * high_stride)[:, None]
        scale_rows = rows_c * scales_stride
        magic = gl.full([BLOCK_N, 16], 0x43004300, gl.int32, layout=L)  # 128 in bf16, twice
        one = gl.full([BLOCK_N, 16], 0x3F803F80, gl.int32, layout=L)  # 1.0 in bf16, twice
        neg = gl.full(
            [BLOCK_N, 16], (0xC300 | OFFSET) * 65537 - 4294967296, gl.int32, layout=L
        )  # -(128 + OFFSET)
        acc = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
        u0 = split * UNITS_SPLIT
        last = u0 + UNITS_SPLIT - 1
        w, g, s0, s1 = _pairs_load(
            codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows, u0, i, BITS
        )
        w2, g2, t0, t1 = w, g, s0, s1
        if STEP == 2:
            w2, g2, t0, t1 = _pairs_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows,
                                         gl.minimum(u0 + 1, last), i, BITS)  # fmt: skip
        pdl_wait(PDL)  # kernels/pdl.py: the first step's WEIGHT planes above, x and the output only below
        pdl_launch_dependents(PDL)
        for unit in range(u0, u0 + UNITS_SPLIT, STEP):
            # the next step's units first (past the split's end a unit loads the last one again: no branch)
            w_n, g_n, s0_n, s1_n = _pairs_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows,
                                               gl.minimum(unit + STEP, last), i, BITS)  # fmt: skip
            w2_n, g2_n, t0_n, t1_n = w_n, g_n, s0_n, s1_n
            if STEP == 2:
                w2_n, g2_n, t0_n, t1_n = _pairs_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows,
                                                     scale_rows, gl.minimum(unit + 3, last), i, BITS)  # fmt: skip
            acc = _pairs_unit(acc, w, g, s0, s1, xw_ptr, unit, i, magic, one, neg, BITS, BLOCK_N, L)
            if STEP == 2:
                acc = _pairs_unit(acc, w2, g2, t0, t1, xw_ptr, unit + 1, i, magic, one, neg, BITS, BLOCK_N, L)
            w, g, s0, s1 = w_n, g_n, s0_n, s1_n
            w2, g2, t0, t1 = w2_n, g2_n, t0_n, t1_n
        _store_rows(out_ptr, acc, 1.0, rows, N)

    @gluon.jit
    def _ring_plane_offs(
        N, stride, i, STEP: gl.constexpr, BLOCK_N: gl.constexpr, L: gl.constexpr, COLS: gl.constexpr = 16
    ):
        # a plane's copy offsets [STEP * BLOCK_N, COLS] (COLS elements a row and unit: 16, W8's 32 words; layout L, a
        # thread the elements it reads back), relative to the row's unit 0: slot row R is row R % BLOCK_N (clamped)
        # of unit R // BLOCK_N
        rr = gl.arange(0, STEP * BLOCK_N, layout=gl.SliceLayout(1, L))
        r2 = gl.minimum(gl.program_id(0) * BLOCK_N + rr % BLOCK_N, N - 1).to(gl.int64)[:, None]
        return r2 * stride + (rr // BLOCK_N * COLS)[:, None] + i[None, :]

    @gluon.jit
    def _ring_group_offs(N, codes_stride, high_stride, scales_stride, i, STEP: gl.constexpr, BLOCK_N: gl.constexpr,
                         NUM_WARPS: gl.constexpr, L: gl.constexpr):  # fmt: skip
        # _ring_start's offsets for the groupwise formats: the code words, the high plane and the scale words (a
        # unit's two fp16 scales; a thread one word of slot row R)
        LS: gl.constexpr = gl.BlockedLayout([1], [32], [NUM_WARPS], [0])
        rs = gl.arange(0, STEP * BLOCK_N, layout=LS)
        sc_offs = gl.minimum(gl.program_id(0) * BLOCK_N + rs % BLOCK_N, N - 1).to(gl.int64) * scales_stride
        return (
            _ring_plane_offs(N, codes_stride, i, STEP, BLOCK_N, L), _ring_plane_offs(N, high_stride, i, STEP, BLOCK_N, L),
            sc_offs + rs // BLOCK_N,
        )  # fmt: skip

    @gluon.jit
    def _mma_store(out_ptr, acc, rows, i, N, split, T: gl.constexpr):
        # the MMA kernels' C to out ([T, N] in x's dtype, or the split's fp32 partials [SPLIT_K, T, N]): element
        # (r, c) is weight row r, x row 2 (c // 4) + c % 4 when c % 4 < 2 (the rest are 0.0)
        out_row = (i // 4) * 2 + i % 4
        mask = (rows < N)[:, None] & ((i % 4 < 2) & (out_row < T))[None, :]
        offs = (split * T + out_row)[None, :] * N + rows[:, None]
        gl.store(out_ptr + offs, acc.to(gl.float32, bitcast=True).to(out_ptr.dtype.element_ty), mask=mask)

    @gluon.jit
    def _ring_slot(BLOCK_N: gl.constexpr, STEP: gl.constexpr, KIND: gl.constexpr):
        # one ring slot of STEP units (KIND: the groupwise BITS 4/5/6/8, 0 NVFP4, 1 FP8 rows): code words [STEP * BLOCK_N,
        # 16] (unit-major: a unit's rows at a 64-byte pitch, so a quarter warp's two rows of 16-byte reads fill 128
        # consecutive bytes, no bank conflicts), Q5 / Q6's high bytes / halves (the code words again otherwise),
        # the scales (groupwise: a word a row, its two fp16 group scales [STEP * BLOCK_N]; NVFP4: the 8 E4M3 block
        # scale bytes of a row [STEP * BLOCK_N, 8]; W8: 32 code words and 2 scale words (4 fp16) a row and unit).
        # Allocations of their own: Triton's barrier analysis tells
        # buffers apart, not parts of one, so a slot being read and another being filled need no barrier between.
        FLAT: gl.constexpr = gl.SwizzledSharedLayout(1, 1, 1, [1, 0])
        codes = gl.allocate_shared_memory(gl.int32, [STEP * BLOCK_N, 32 if KIND == 8 else 16], FLAT)
        high = codes
        if KIND == 5:
            high = gl.allocate_shared_memory(gl.uint8, [STEP * BLOCK_N, 16], FLAT)
        if KIND == 6:
            high = gl.allocate_shared_memory(gl.int16, [STEP * BLOCK_N, 16], FLAT)
        if KIND == 0:
            scales = gl.allocate_shared_memory(gl.uint8, [STEP * BLOCK_N, 8], FLAT)
        elif KIND == 1:
            scales = codes  # (FP8 rows: the row scale is read once, at the end)
        elif KIND == 8:
            scales = gl.allocate_shared_memory(gl.int32, [STEP * BLOCK_N, 2], FLAT)
        else:
            scales = gl.allocate_shared_memory(
                gl.int32, [STEP * BLOCK_N], gl.SwizzledSharedLayout(1, 1, 1, [0])
            )
        return codes, high, scales

    @gluon.jit
    def _ring_issue(slot, src, unit0, KIND: gl.constexpr):
        # a stage's copies (STEP units from unit0) into ``slot``, one commit group. src: (codes_ptr, high_ptr,
        # scales_ptr, code_offs, high_offs, sc_offs), the offsets of unit 0 of the program's rows: code_offs /
        # high_offs [STEP * BLOCK_N, 16] in layout L (a thread copies the 16 bytes it reads back), sc_offs a word
        # (groupwise) or 4 bytes (NVFP4: two copies, the 512-byte scale columns of blocks 0-3 and 4-7) a thread
        codes, high, scales = slot
        codes_ptr, high_ptr, scales_ptr, code_offs, high_offs, sc_offs = src
        async_copy.async_copy_global_to_shared(
            codes, codes_ptr + code_offs + unit0 * (32 if KIND == 8 else 16)
        )
        if KIND == 5 or KIND == 6:
            async_copy.async_copy_global_to_shared(high, high_ptr + high_offs + unit0 * 16)
        if KIND == 0:
            async_copy.async_copy_global_to_shared(scales, scales_ptr + sc_offs + unit0 * 1024)
        if KIND == 8:
            async_copy.async_copy_global_to_shared(scales, scales_ptr + sc_offs + unit0 * 2)
        elif KIND >= 4:
            async_copy.async_copy_global_to_shared(scales, scales_ptr + sc_offs + unit0)
        async_copy.commit_group()

    @gluon.jit
    def _nvfp4_unit(acc, w, sc, xw_ptr, unit, i, BLOCK_N: gl.constexpr, L: gl.constexpr):
        # acc [BLOCK_N, 16] += one 128-lane step of NVFP4 products: word i's 8 lanes (_nvfp4_pair_f32 a byte) times
        # its block's E4M3 scale ``sc`` (uint8, the word's block)
        part = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
        w4 = w >> 4
        for c in gl.static_range(4):
            part = _nvfp4_pair_f32(w, w4, gl.load(xw_ptr + unit * 64 + 4 * i + c), c, part)
        return gl.fma(part, sc.to(gl.float8e4nv, bitcast=True).to(gl.float32), acc)

    @gluon.jit
    def _ring_stage(acc, slot, xw_ptr, unit0, i, consts, STEP: gl.constexpr, KIND: gl.constexpr,
                    BLOCK_N: gl.constexpr, L: gl.constexpr, ASM: gl.constexpr):  # fmt: skip
        # acc += a stage's products from ``slot`` (its copies landed and are visible), a unit: groupwise
        # _pairs_unit (consts: magic, one, neg) or, with an ASM text, _mma_unit (consts: magic, x_ptrs, x_mask);
        # NVFP4 _nvfp4_unit; FP8 rows _fp8_step
        codes, high, scales = slot
        # NVFP4: a row's 8 block scales, a thread the two of its 4 words
        L8: gl.constexpr = gl.BlockedLayout([1, 2], [8, 4], [L.warps_per_cta[0], 1], [1, 0])
        for u in gl.static_range(STEP):
            w = codes.slice(u * BLOCK_N, BLOCK_N).load(L)
            if KIND == 0:  # (each scale widened to the two words of its block)
                sb = scales.slice(u * BLOCK_N, BLOCK_N).load(L8)
                sc = gl.convert_layout(gl.reshape(gl.join(sb, sb), [BLOCK_N, 16]), L)
                acc = _nvfp4_unit(acc, w, sc, xw_ptr, unit0 + u, i, BLOCK_N, L)
            elif KIND == 1:
                acc = _fp8_step(acc, w, xw_ptr, unit0 + u, i)
            elif KIND == 8:
                # W8: _quant_gemv_w8_pairs_kernel's unit, its 4 group scales from the slot's 2 words
                words = scales.slice(u * BLOCK_N, BLOCK_N)
                for j in gl.static_range(4):
                    sw = words.slice(j // 2, 1, dim=1).load(L)  # [BLOCK_N, 1]
                    sj = (
                        ((sw >> (16 * (j % 2))) & 0xFFFF)
                        .to(gl.int16)
                        .to(gl.float16, bitcast=True)
                        .to(gl.float32)
                    )
                    acc = _w8_group(acc, w, sj, xw_ptr, unit0 + u, i, j, consts)
            else:
                g = w
                if KIND == 5:  # as _pairs_load: byte i spread to bits 0..7 and 12..19
                    h = high.slice(u * BLOCK_N, BLOCK_N).load(L).to(gl.int32) & 0xFF
                    g = h | (h << 12)
                if KIND == 6:
                    h = high.slice(u * BLOCK_N, BLOCK_N).load(L).to(gl.int32) & 0xFFFF
                    g = (h & 0xFF) | ((h & 0xFF00) << 8)
                sw = scales.slice(u * BLOCK_N, BLOCK_N).load(gl.SliceLayout(1, L))
                s0 = (sw & 0xFFFF).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
                s1 = (sw >> 16).to(gl.int16).to(gl.float16, bitcast=True).to(gl.float32)
                if ASM == "":
                    magic, one, neg = consts
                    acc = _pairs_unit(
                        acc, w, g, s0, s1, xw_ptr, unit0 + u, i, magic, one, neg, KIND, BLOCK_N, L
                    )
                else:
                    magic, x_ptrs, x_mask = consts
                    acc = _mma_unit(acc, w, g, s0, s1, x_ptrs, x_mask, unit0 + u, magic, KIND, ASM)
        return acc

    @gluon.jit
    def _ring_step(acc, ring, k: gl.constexpr, t, src, xw_ptr, u0, i, consts, ITERS: gl.constexpr,
                   STAGES: gl.constexpr, STEP: gl.constexpr, KIND: gl.constexpr, BLOCK_N: gl.constexpr,
                   L: gl.constexpr, ASM: gl.constexpr):  # fmt: skip
        # stage t (in slot k = t % STAGES): wait for its copies, one barrier, refill the slot stage t - 1 used with
        # stage t + STAGES - 1 (an empty group past the last), then its products
        async_copy.wait_group(STAGES - 2)  # this thread's copies of stage t have landed
        gl.thread_barrier()  # ... every thread's; every thread is done with stage t - 1's slot
        if t + STAGES - 1 < ITERS:
            _ring_issue(ring[(k + STAGES - 1) % STAGES], src, u0 + (t + STAGES - 1) * STEP, KIND)
        else:
            async_copy.commit_group()
        return _ring_stage(acc, ring[k], xw_ptr, u0 + t * STEP, i, consts, STEP, KIND, BLOCK_N, L, ASM)

    @gluon.jit
    def _ring_start(codes_ptr, high_ptr, scales_ptr, code_offs, high_offs, sc_offs, u0, ITERS: gl.constexpr,
                    STAGES: gl.constexpr, STEP: gl.constexpr, KIND: gl.constexpr, BLOCK_N: gl.constexpr):  # fmt: skip
        # a ring of STAGES slots (2..4) and its first STAGES - 1 stages of STEP units from unit u0 issued; reads
        # WEIGHT planes alone (codes, high bits, scales: under PDL it runs before the wait). Returns (ring, src)
        # for _ring_loop.
        gl.static_assert(STAGES >= 2 and STAGES <= 4, "ring slots: 2..4")
        src = (codes_ptr, high_ptr, scales_ptr, code_offs, high_offs, sc_offs)
        s0 = _ring_slot(BLOCK_N, STEP, KIND)
        s1 = _ring_slot(BLOCK_N, STEP, KIND)
        s2 = s0
        s3 = s0
        if STAGES >= 3:
            s2 = _ring_slot(BLOCK_N, STEP, KIND)
        if STAGES >= 4:
            s3 = _ring_slot(BLOCK_N, STEP, KIND)
        ring = (s0, s1, s2, s3)
        for k in gl.static_range(STAGES - 1):
            if k < ITERS:
                _ring_issue(ring[k], src, u0 + k * STEP, KIND)
            else:
                async_copy.commit_group()  # (an empty group: the count _ring_step waits for stays STAGES - 2)
        return ring, src

    @gluon.jit
    def _ring_loop(acc, ring, src, xw_ptr, u0, i, consts, ITERS: gl.constexpr, STAGES: gl.constexpr,
                   STEP: gl.constexpr, KIND: gl.constexpr, BLOCK_N: gl.constexpr, L: gl.constexpr,
                   ASM: gl.constexpr):  # fmt: skip
        # the program's ITERS stages after _ring_start: _ring_step a stage, the loop unrolled by STAGES so each
        # slot is a static index
        if ITERS > STAGES:
            for t0 in range(0, ITERS, STAGES):
                for k in gl.static_range(STAGES):
                    if t0 + k < ITERS:
                        acc = _ring_step(acc, ring, k, t0 + k, src, xw_ptr, u0, i, consts, ITERS, STAGES, STEP, KIND,
                                         BLOCK_N, L, ASM)  # fmt: skip
        else:  # (one pass: unrolled whole; Triton's lowering fails on the loop folded from a single trip)
            for t in gl.static_range(ITERS):
                acc = _ring_step(acc, ring, t, t, src, xw_ptr, u0, i, consts, ITERS, STAGES, STEP, KIND, BLOCK_N, L,
                                 ASM)  # fmt: skip
        async_copy.wait_group(
            0
        )  # (only empty groups are left: nothing lands in this CTA's memory after it exits)
        return acc

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_ring_kernel(
        xw_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        out_ptr,
        final_ptr,  # LAST: the outputs [N] (x's dtype); out_ptr the fp32 partials
        count_ptr,  # LAST: int32 ticket counters, one a row tile
        N,
        codes_stride,
        high_stride,
        scales_stride,
        BITS: gl.constexpr,
        UNITS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        STEP: gl.constexpr,  # units a stage
        STAGES: gl.constexpr,  # ring slots, 2..4: STAGES - 1 stages in flight while one is computed
        PDL: gl.constexpr,
        LAST: gl.constexpr,  # the last split sums the partials (NINFER_SPLITK_REDUCE=last)
    ):
        # _quant_gemv_pairs_kernel's arithmetic (the same layout L, _pairs_unit), its weight bytes streamed
        # through a ring of STAGES shared-memory slots by cp.async instead of a register prefetch: the bytes in
        # flight no longer cost registers (the pairs kernel: 127 registers, 25% occupancy, DRAM 50% on the H200).
        # Stage t: wait for its copy group, one barrier (its bytes visible to every thread; the slot refilled
        # next, stage t - 1's, read by every thread), issue stage t + STAGES - 1, compute stage t (_ring_loop).
        # scales_ptr: the fp16 scales as int32 words [N, K_pad / 128] (a unit's two group scales, low half first;
        # scales_stride in words); the rest as the pairs kernel's.
        L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [NUM_WARPS, 1], [1, 0])
        OFFSET: gl.constexpr = 1 << (BITS - 1)
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 16, L)
        code_offs, high_offs, sc_offs = _ring_group_offs(N, codes_stride, high_stride, scales_stride, i, STEP, BLOCK_N,
                                                         NUM_WARPS, L)  # fmt: skip
        u0 = gl.program_id(1) * UNITS_SPLIT
        ring, src = _ring_start(codes_ptr, high_ptr, scales_ptr, code_offs, high_offs, sc_offs, u0, UNITS_SPLIT // STEP,
                                STAGES, STEP, BITS, BLOCK_N)  # fmt: skip
        pdl_wait(PDL)  # kernels/pdl.py: the first stages' WEIGHT planes above, x and the output only below
        pdl_launch_dependents(PDL)
        consts = (
            gl.full([BLOCK_N, 16], 0x43004300, gl.int32, layout=L),  # 128 in bf16, twice
            gl.full([BLOCK_N, 16], 0x3F803F80, gl.int32, layout=L),  # 1.0 in bf16, twice
            gl.full(
                [BLOCK_N, 16], (0xC300 | OFFSET) * 65537 - 4294967296, gl.int32, layout=L
            ),  # -(128 + OFFSET)
        )
        acc = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
        acc = _ring_loop(acc, ring, src, xw_ptr, u0, i, consts, UNITS_SPLIT // STEP, STAGES, STEP, BITS, BLOCK_N, L,
                         "")  # fmt: skip
        _ring_store(out_ptr, final_ptr, count_ptr, acc, 1.0, rows, N, LAST, L)

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_nvfp4_ring_kernel(
        xw_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        final_ptr,  # LAST: the outputs [N] (x's dtype); out_ptr the fp32 partials
        count_ptr,  # LAST: int32 ticket counters, one a row tile
        N,
        codes_stride,
        tile_stride,
        out_scale,
        STEPS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        STEP: gl.constexpr,  # 128-lane steps a stage
        STAGES: gl.constexpr,  # ring slots, 2..4
        PDL: gl.constexpr,
        LAST: gl.constexpr,  # the last split sums the partials (NINFER_SPLITK_REDUCE=last)
    ):
        # _quant_gemv_nvfp4_rows_kernel's arithmetic (_nvfp4_unit), its code words and block scales streamed
        # through a ring of STAGES shared-memory slots by cp.async (_ring_start / _ring_loop; see _quant_gemv_ring_kernel). A
        # row's 8 scales of a step are two 4-byte runs of the swizzled tiles, 512 bytes apart (blocks 0-3, 4-7).
        L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [NUM_WARPS, 1], [1, 0])
        LB: gl.constexpr = gl.BlockedLayout(
            [1, 4], [16, 2], [NUM_WARPS, 1], [1, 0]
        )  # a thread one 4-byte run
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 16, L)
        code_offs = _ring_plane_offs(N, codes_stride, i, STEP, BLOCK_N, L)
        rb = gl.arange(0, STEP * BLOCK_N, layout=gl.SliceLayout(1, LB))
        row = gl.minimum(gl.program_id(0) * BLOCK_N + rb % BLOCK_N, N - 1).to(gl.int64)
        inner = row % 128
        j = gl.arange(0, 8, layout=gl.SliceLayout(0, LB))
        sc_offs = (row // 128 * tile_stride + (inner % 32) * 16 + (inner // 32) * 4 + rb // BLOCK_N * 1024)[
            :, None
        ] + ((j // 4) * 512 + j % 4)[None, :]
        u0 = gl.program_id(1) * STEPS_SPLIT
        ring, src = _ring_start(codes_ptr, codes_ptr, scales_ptr, code_offs, code_offs, sc_offs, u0, STEPS_SPLIT // STEP,
                                STAGES, STEP, 0, BLOCK_N)  # fmt: skip
        pdl_wait(
            PDL
        )  # kernels/pdl.py: the first stages' WEIGHT words and scales above, x and the output only below
        pdl_launch_dependents(PDL)
        acc = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
        acc = _ring_loop(acc, ring, src, xw_ptr, u0, i, 0, STEPS_SPLIT // STEP, STAGES, STEP, 0, BLOCK_N, L,
                         "")  # fmt: skip
        _ring_store(out_ptr, final_ptr, count_ptr, acc, out_scale, rows, N, LAST, L)

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_mma_ring_kernel(
        xw_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        out_ptr,
        final_ptr,  # LAST: the outputs [T, N] (x's dtype); out_ptr the fp32 partials [SPLIT_K, T, N]
        count_ptr,  # LAST: int32 ticket counters, one a row tile
        N,
        xw_stride,
        codes_stride,
        high_stride,
        scales_stride,
        T: gl.constexpr,  # rows of x, 1..8
        BITS: gl.constexpr,
        UNITS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        STEP: gl.constexpr,  # units a stage
        STAGES: gl.constexpr,  # ring slots, 2..4
        ASM: gl.constexpr,  # MMA_GROUP_ASM[BITS]
        PDL: gl.constexpr,
        LAST: gl.constexpr,  # the last split sums the partials (NINFER_SPLITK_REDUCE=last)
    ):
        # _quant_gemv_mma_kernel's arithmetic (_mma_unit on the tensor cores, 1..8 rows of x, a row's output the
        # same bits whatever T), its weight bytes streamed through a ring of STAGES shared-memory slots by
        # cp.async (_ring_start / _ring_loop; see _quant_gemv_ring_kernel; scales_ptr as int32 words there)
        L: gl.constexpr = gl.BlockedLayout([2, 4], [8, 4], [NUM_WARPS, 1], [1, 0])
        split = gl.program_id(1)
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 16, L)
        code_offs, high_offs, sc_offs = _ring_group_offs(N, codes_stride, high_stride, scales_stride, i, STEP, BLOCK_N,
                                                         NUM_WARPS, L)  # fmt: skip
        u0 = split * UNITS_SPLIT
        ring, src = _ring_start(codes_ptr, high_ptr, scales_ptr, code_offs, high_offs, sc_offs, u0, UNITS_SPLIT // STEP,
                                STAGES, STEP, BITS, BLOCK_N)  # fmt: skip
        pdl_wait(PDL)  # kernels/pdl.py: the first stages' WEIGHT planes above, x and the output only below
        pdl_launch_dependents(PDL)
        x_row = (gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L)) % 16) // 2  # the quad's row of x
        x_ptrs = xw_ptr + (gl.minimum(x_row, T - 1) * xw_stride)[:, None] + i[None, :]
        x_mask = (x_row < T)[:, None] & (i >= 0)[None, :]
        consts = (
            gl.full([BLOCK_N, 16], 0x43004300, gl.int32, layout=L),
            x_ptrs,
            x_mask,
        )  # (128 in bf16, twice)
        acc = gl.zeros([BLOCK_N, 16], gl.int32, layout=L)  # fp32 bits (0.0)
        acc = _ring_loop(acc, ring, src, xw_ptr, u0, i, consts, UNITS_SPLIT // STEP, STAGES, STEP, BITS, BLOCK_N, L,
                         ASM)  # fmt: skip
        _mma_store(out_ptr, acc, rows, i, N, split, T)
        if LAST:  # as _ring_store, on the MMA kernels' C layout (each row of x, each weight row of the tile)
            if _last_split(count_ptr):
                out_row = (i // 4) * 2 + i % 4
                mask = (rows < N)[:, None] & ((i % 4 < 2) & (out_row < T))[None, :]
                offs = out_row[None, :] * N + rows[:, None]
                total = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
                for s in range(gl.num_programs(1)):
                    total += gl.load(out_ptr + s * (T * N) + offs, mask=mask, other=0.0, cache_modifier=".cg")
                gl.store(final_ptr + offs, total.to(final_ptr.dtype.element_ty), mask=mask)

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_fp8_ring_kernel(
        xw_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        final_ptr,  # LAST: the outputs [N] (x's dtype); out_ptr the fp32 partials
        count_ptr,  # LAST: int32 ticket counters, one a row tile
        N,
        codes_stride,
        STEPS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        STEP: gl.constexpr,  # 64-lane steps a stage
        STAGES: gl.constexpr,  # ring slots, 2..4
        PDL: gl.constexpr,
        LAST: gl.constexpr,  # the last split sums the partials (NINFER_SPLITK_REDUCE=last)
    ):
        # _quant_gemv_fp8_rows_kernel's arithmetic (_fp8_step), its code words streamed through a ring of STAGES
        # shared-memory slots by cp.async (_ring_start / _ring_loop; see _quant_gemv_ring_kernel); the row's bf16 scale
        # multiplies its sum once
        L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [NUM_WARPS, 1], [1, 0])
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 16, L)
        code_offs = _ring_plane_offs(N, codes_stride, i, STEP, BLOCK_N, L)
        u0 = gl.program_id(1) * STEPS_SPLIT
        ring, src = _ring_start(codes_ptr, codes_ptr, codes_ptr, code_offs, code_offs, code_offs, u0, STEPS_SPLIT // STEP,
                                STAGES, STEP, 1, BLOCK_N)  # fmt: skip
        pdl_wait(
            PDL
        )  # kernels/pdl.py: the first stages' WEIGHT words above, x, the row scales and the output below
        pdl_launch_dependents(PDL)
        acc = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
        acc = _ring_loop(acc, ring, src, xw_ptr, u0, i, 0, STEPS_SPLIT // STEP, STAGES, STEP, 1, BLOCK_N, L,
                         "")  # fmt: skip
        _ring_store(
            out_ptr, final_ptr, count_ptr, acc, gl.load(scales_ptr + rows_c).to(gl.float32), rows, N, LAST, L
        )

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_w8_ring_kernel(
        x_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        final_ptr,  # LAST: the outputs [N] (x's dtype); out_ptr the fp32 partials
        count_ptr,  # LAST: int32 ticket counters, one a row tile
        N,
        codes_stride,
        scales_stride,
        UNITS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        STEP: gl.constexpr,  # units a stage
        STAGES: gl.constexpr,  # ring slots, 2..4
        PDL: gl.constexpr,
        LAST: gl.constexpr,  # the last split sums the partials (NINFER_SPLITK_REDUCE=last)
    ):
        # _quant_gemv_w8_pairs_kernel's arithmetic (_w8_group), its code words (32 a row and unit) and scale words
        # (int32 [N, K_pad / 64]: a unit's 4 fp16 group scales in 2 words; scales_stride in words) streamed through
        # a ring of STAGES shared-memory slots by cp.async (_ring_start / _ring_loop; see _quant_gemv_ring_kernel)
        L: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [NUM_WARPS, 1], [1, 0])
        LW: gl.constexpr = gl.BlockedLayout(
            [1, 1], [16, 2], [NUM_WARPS, 1], [1, 0]
        )  # a thread one scale word
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 32, L)
        code_offs = _ring_plane_offs(N, codes_stride, i, STEP, BLOCK_N, L, 32)
        rw = gl.arange(0, STEP * BLOCK_N, layout=gl.SliceLayout(1, LW))
        sc_rows = gl.minimum(gl.program_id(0) * BLOCK_N + rw % BLOCK_N, N - 1).to(gl.int64) * scales_stride
        sc_offs = (sc_rows + rw // BLOCK_N * 2)[:, None] + gl.arange(0, 2, layout=gl.SliceLayout(0, LW))[
            None, :
        ]
        u0 = gl.program_id(1) * UNITS_SPLIT
        ring, src = _ring_start(codes_ptr, codes_ptr, scales_ptr, code_offs, code_offs, sc_offs, u0, UNITS_SPLIT // STEP,
                                STAGES, STEP, 8, BLOCK_N)  # fmt: skip
        pdl_wait(
            PDL
        )  # kernels/pdl.py: the first stages' WEIGHT words and scales above, x and the output only below
        pdl_launch_dependents(PDL)
        magic = gl.full([BLOCK_N, 32], 0x4B000000, gl.int32, layout=L)
        acc = gl.zeros([BLOCK_N, 32], gl.float32, layout=L)
        acc = _ring_loop(acc, ring, src, x_ptr, u0, i, magic, UNITS_SPLIT // STEP, STAGES, STEP, 8, BLOCK_N, L,
                         "")  # fmt: skip
        _ring_store(out_ptr, final_ptr, count_ptr, acc, 1.0, rows, N, LAST, L)

    @gluon.jit
    def _mma_unit(acc, w, g, s0, s1, x_ptrs, x_mask, unit, magic, BITS: gl.constexpr, ASM: gl.constexpr):
        # acc [BLOCK_N, 16] (int32 bits of fp32) += one unit's products on the tensor cores: per group (pair
        # planes 2h, 2h + 1), the pair words as bf16 128 + u, x's lane-pair words as they are (bf16: each
        # thread loads its quad's row of x, zeros past the last), one mma_group_asm a group
        for half in gl.static_range(2):
            ta = _pairs_word(w, g, magic, 2 * half, BITS)
            tb = _pairs_word(w, g, magic, 2 * half + 1, BITS)
            xa = gl.load(x_ptrs + (unit * 64 + 32 * half), mask=x_mask, other=0)
            xb = gl.load(x_ptrs + (unit * 64 + 32 * half + 16), mask=x_mask, other=0)
            s = (s0 if half == 0 else s1).to(gl.int32, bitcast=True)[:, None]
            acc = gl.inline_asm_elementwise(
                ASM,
                # 8 outputs, 48 inputs
                "=r,=r,=r,=r,=r,=r,=r,=r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r,r",
                [acc, ta, tb, xa, xb, s], dtype=gl.int32, is_pure=True, pack=8,
            )  # fmt: skip
        return acc

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_mma_kernel(
        xw_ptr,
        codes_ptr,
        high_ptr,
        scales_ptr,
        out_ptr,
        N,
        xw_stride,
        codes_stride,
        high_stride,
        scales_stride,
        T: gl.constexpr,  # rows of x, 1..8
        BITS: gl.constexpr,
        UNITS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        STEP: gl.constexpr,  # units a loop step (1 or 2), as _quant_gemv_pairs_kernel's
        ASM: gl.constexpr,  # MMA_GROUP_ASM[BITS]
        PDL: gl.constexpr,
    ):
        # _quant_gemv_pairs_kernel's weight loads, the products on the tensor cores (mma.sync m16n8k16, bf16,
        # fp32 accumulate) for 1..8 rows of x: a thread holds 2 weight rows x 4 words (L), so a quad of lanes
        # holds two rows' 16 words, exactly the A fragment of one 16-row MMA tile (rows 2q, 2q + 1 of the warp's
        # 16 as the fragment's rows q, q + 8), and quad q loads row q of x (the B fragment's column q; see
        # mma_asm.mma_group_asm). Lane 4q + j ends with x rows 2j, 2j + 1 of its two weight rows in its elements
        # (r, 0) and (r, 1). Each output is one C column: a row of x gives the same bits whatever T (batch
        # invariant). xw_ptr: x [T, K] bf16 as int32 lane pairs (xw_stride in words); out: [T, N] in x's dtype (one
        # split) or fp32 partials [SPLIT_K, T, N].
        L: gl.constexpr = gl.BlockedLayout([2, 4], [8, 4], [NUM_WARPS, 1], [1, 0])
        split = gl.program_id(1)
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 16, L)
        code_rows = (rows_c * codes_stride)[:, None]
        high_rows = (rows_c * high_stride)[:, None]
        scale_rows = rows_c * scales_stride
        x_row = (gl.arange(0, BLOCK_N, layout=gl.SliceLayout(1, L)) % 16) // 2  # the quad's row of x
        x_ptrs = xw_ptr + (gl.minimum(x_row, T - 1) * xw_stride)[:, None] + i[None, :]
        x_mask = (x_row < T)[:, None] & (i >= 0)[None, :]
        magic = gl.full([BLOCK_N, 16], 0x43004300, gl.int32, layout=L)  # 128 in bf16, twice
        acc = gl.zeros([BLOCK_N, 16], gl.int32, layout=L)  # fp32 bits (0.0)
        u0 = split * UNITS_SPLIT
        last = u0 + UNITS_SPLIT - 1
        w, g, s0, s1 = _pairs_load(
            codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows, u0, i, BITS
        )
        w2, g2, t0, t1 = w, g, s0, s1
        if STEP == 2:
            w2, g2, t0, t1 = _pairs_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows,
                                         gl.minimum(u0 + 1, last), i, BITS)  # fmt: skip
        pdl_wait(PDL)  # kernels/pdl.py: the first step's WEIGHT planes above, x and the output only below
        pdl_launch_dependents(PDL)
        for unit in range(u0, u0 + UNITS_SPLIT, STEP):
            w_n, g_n, s0_n, s1_n = _pairs_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows, scale_rows,
                                               gl.minimum(unit + STEP, last), i, BITS)  # fmt: skip
            w2_n, g2_n, t0_n, t1_n = w_n, g_n, s0_n, s1_n
            if STEP == 2:
                w2_n, g2_n, t0_n, t1_n = _pairs_load(codes_ptr, high_ptr, scales_ptr, code_rows, high_rows,
                                                     scale_rows, gl.minimum(unit + 3, last), i, BITS)  # fmt: skip
            acc = _mma_unit(acc, w, g, s0, s1, x_ptrs, x_mask, unit, magic, BITS, ASM)
            if STEP == 2:
                acc = _mma_unit(acc, w2, g2, t0, t1, x_ptrs, x_mask, unit + 1, magic, BITS, ASM)
            w, g, s0, s1 = w_n, g_n, s0_n, s1_n
            w2, g2, t0, t1 = w2_n, g2_n, t0_n, t1_n
        _mma_store(out_ptr, acc, rows, i, N, split, T)

    @gluon.jit
    def _fp8_word_f32(w):
        # a word of 4 E4M3 codes (lanes 4i .. 4i + 3) -> their 4 values as fp32, exact (two hardware E4M3-pair
        # to f16-pair conversions, then each f16 widened)
        p0, p1 = gl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.rn.f16x2.e4m3x2 $0, l; cvt.rn.f16x2.e4m3x2 $1, h; }",
            "=r,=r,r", [w], dtype=(gl.int32, gl.int32), is_pure=True, pack=1,
        )  # fmt: skip
        a0, a1 = gl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=r,=r,r", [p0], dtype=(gl.float32, gl.float32), is_pure=True, pack=1,
        )  # fmt: skip
        a2, a3 = gl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=r,=r,r", [p1], dtype=(gl.float32, gl.float32), is_pure=True, pack=1,
        )  # fmt: skip
        return a0, a1, a2, a3

    @gluon.jit
    def _fp8_step(acc, w, xw_ptr, step, i):
        # acc [BLOCK_N, 16] += one step's products: word i of a row holds lanes 64 step + 4i .. 4i + 3, whose x
        # values are x's lane-pair words 32 step + 2i and 32 step + 2i + 1
        a0, a1, a2, a3 = _fp8_word_f32(w)
        xa = gl.load(xw_ptr + step * 32 + 2 * i)
        xb = gl.load(xw_ptr + step * 32 + 2 * i + 1)
        acc = gl.fma(a0, (xa << 16).to(gl.float32, bitcast=True)[None, :], acc)
        acc = gl.fma(a1, (xa & -65536).to(gl.float32, bitcast=True)[None, :], acc)
        acc = gl.fma(a2, (xb << 16).to(gl.float32, bitcast=True)[None, :], acc)
        return gl.fma(a3, (xb & -65536).to(gl.float32, bitcast=True)[None, :], acc)

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_fp8_rows_kernel(
        xw_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        N,
        codes_stride,
        STEPS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        PDL: gl.constexpr,
    ):
        # FP8 rows (E4M3 codes, one bf16 scale a row), one bf16 row of x (K a multiple of 64) as int32 lane pairs:
        # grid (cdiv(N, BLOCK_N), SPLIT_K), a program walks STEPS_SPLIT steps of 64 lanes, the next step's words
        # loaded before this one's are used; codes_ptr: int32 words (codes_stride in words); the row scale
        # multiplies the fp32 sum at the end; out: [N] in bf16 (one split) or fp32 partials [SPLIT_K, N]
        L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [NUM_WARPS, 1], [1, 0])
        split = gl.program_id(1)
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 16, L)
        w_offs = (rows_c * codes_stride)[:, None] + i[None, :]
        acc = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
        s0 = split * STEPS_SPLIT
        last = s0 + STEPS_SPLIT - 1
        w = _weight_step_load(codes_ptr, w_offs, s0, 16)
        pdl_wait(PDL)  # kernels/pdl.py: the first step's WEIGHT words above, x and the output only below
        pdl_launch_dependents(PDL)
        for step in range(s0, s0 + STEPS_SPLIT):
            w_n = _weight_step_load(codes_ptr, w_offs, gl.minimum(step + 1, last), 16)
            acc = _fp8_step(acc, w, xw_ptr, step, i)
            w = w_n
        _store_rows(out_ptr, acc, gl.load(scales_ptr + rows_c).to(gl.float32), rows, N)

    @gluon.jit
    def _nvfp4_pair_f32(w, w4, x_pair, c: gl.constexpr, part):
        # byte c of each word: E2M1 codes of lanes 2c (low nibble) and 2c + 1 (high) -> binary16 bits of 2^-14
        # times their values (sign to bit 15, exponent and mantissa bits to 11..9; E2M1's 0.5 becomes the
        # subnormal 2^-15) in the two halves of one word, then each widened to fp32 (exact) and multiplied with
        # x's lane pair (one 32-bit word of bf16 x). One byte permute puts the low nibble (byte c of w) in bits
        # 0..3 and the high one (byte c of w4 = w >> 4) in bits 16..19; two shifts and two masks place them.
        SEL: gl.constexpr = c | (c << 4) | ((4 + c) << 8) | ((4 + c) << 12)
        t = gl.inline_asm_elementwise(
            f"prmt.b32 $0, $1, $2, {SEL};", "=r,r,r", [w, w4], dtype=gl.int32, is_pure=True, pack=1
        )
        h = ((t << 9) & 0x0E000E00) | ((t << 12) & -2147450880)  # -2147450880: 0x80008000
        lo, hi = gl.inline_asm_elementwise(
            "{ .reg .b16 l, h; mov.b32 {l, h}, $2; cvt.f32.f16 $0, l; cvt.f32.f16 $1, h; }",
            "=r,=r,r", [h], dtype=(gl.float32, gl.float32), is_pure=True, pack=1,
        )  # fmt: skip
        part = gl.fma(lo, (x_pair << 16).to(gl.float32, bitcast=True)[None, :], part)
        return gl.fma(hi, (x_pair & -65536).to(gl.float32, bitcast=True)[None, :], part)

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_nvfp4_rows_kernel(
        xw_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        N,
        codes_stride,
        tile_stride,
        out_scale,
        STEPS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        PDL: gl.constexpr,
    ):
        # NVFP4 (E2M1 codes two a byte, low nibble first; an E4M3 scale a block of 16 lanes in the swizzled
        # 128x4 tiles; out_scale = 2^14 / the per-tensor divisor), one bf16 row of x (K a multiple of 128) as int32
        # lane pairs. Grid (cdiv(N, BLOCK_N), SPLIT_K); a step is 128 lanes a row: 16 words, word i lanes 8i ..
        # 8i + 7 of block i // 2. codes_ptr: int32 words (codes_stride in words); out as the other kernels.
        L: gl.constexpr = gl.BlockedLayout([1, 4], [8, 4], [NUM_WARPS, 1], [1, 0])
        split = gl.program_id(1)
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 16, L)
        w_offs = (rows_c * codes_stride)[:, None] + i[None, :]
        inner = rows_c % 128
        # scale byte of (row n, block b = 8 step + i // 2): the row's part + (b // 4) * 512 + b % 4
        s_offs = (rows_c // 128 * tile_stride + (inner % 32) * 16 + (inner // 32) * 4)[:, None] + (
            (i // 8) * 512 + (i // 2) % 4
        )[None, :]
        acc = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
        s0 = split * STEPS_SPLIT
        last = s0 + STEPS_SPLIT - 1
        w = _weight_step_load(codes_ptr, w_offs, s0, 16)
        sc = _weight_step_load(scales_ptr, s_offs, s0, 1024)
        pdl_wait(PDL)  # kernels/pdl.py: the first step's WEIGHTS above, x and the output only below
        pdl_launch_dependents(PDL)
        for step in range(s0, s0 + STEPS_SPLIT):
            nxt = gl.minimum(step + 1, last)
            w_n = _weight_step_load(codes_ptr, w_offs, nxt, 16)
            sc_n = _weight_step_load(scales_ptr, s_offs, nxt, 1024)
            part = gl.zeros([BLOCK_N, 16], gl.float32, layout=L)
            w4 = w >> 4
            for c in gl.static_range(4):
                part = _nvfp4_pair_f32(w, w4, gl.load(xw_ptr + step * 64 + 4 * i + c), c, part)
            acc = gl.fma(part, sc.to(gl.float8e4nv, bitcast=True).to(gl.float32), acc)
            w = w_n
            sc = sc_n
        _store_rows(out_ptr, acc, out_scale, rows, N)

    @gluon.jit
    def _w8_group(acc, w, s, x_ptr, unit, i, j: gl.constexpr, magic):
        # acc [BLOCK_N, 32] += group j of a W8 unit: byte j of each word as the float32 2^23 + u (one mask-and-or),
        # one fma with x and -(2^23 + 128) x (exact: 24 significant bits) gives code * x rounded once, a second adds
        # it times the group's scale s [BLOCK_N, 1]
        f = _pairs_and_or(w >> (8 * j), 0xFF, magic).to(gl.float32, bitcast=True)
        x = gl.load(x_ptr + unit * 128 + 32 * j + i).to(gl.float32)[None, :]
        t = gl.fma(f, x, x * -8388736.0)  # (2^23 + u) x - (2^23 + 128) x = code x, rounded once
        return gl.fma(t, s, acc)

    @gluon.jit(do_not_specialize=["N"])
    def _quant_gemv_w8_pairs_kernel(
        x_ptr,
        codes_ptr,
        scales_ptr,
        out_ptr,
        N,
        codes_stride,
        scales_stride,
        UNITS_SPLIT: gl.constexpr,
        BLOCK_N: gl.constexpr,
        NUM_WARPS: gl.constexpr,
        PDL: gl.constexpr,
    ):
        # W8 on the GEMV layout (32 words a unit; byte j of word i is u = code + 128 of lane 32j + i, group j of
        # 32 lanes), one bf16 row of x: a thread holds 4 words of a row (8 threads a row). Each byte becomes the
        # float32 2^23 + u by one mask-and-or; one fma with x and -(2^23 + 128) x (exact: 24 significant bits)
        # gives code * x rounded once, a second adds it times the group's scale. Grid and out as the Q4/Q5/Q6
        # kernel's; codes_ptr: int32 words (codes_stride in words), scales_ptr: fp16 [N, K_pad / 32].
        L: gl.constexpr = gl.BlockedLayout([1, 4], [4, 8], [NUM_WARPS, 1], [1, 0])
        split = gl.program_id(1)
        rows, rows_c, i = _one_row_tile(N, BLOCK_N, 32, L)
        w_offs = (rows_c * codes_stride)[:, None] + i[None, :]
        s_ptrs = scales_ptr + rows_c * scales_stride
        magic = gl.full([BLOCK_N, 32], 0x4B000000, gl.int32, layout=L)
        acc = gl.zeros([BLOCK_N, 32], gl.float32, layout=L)
        u0 = split * UNITS_SPLIT
        last = u0 + UNITS_SPLIT - 1
        w = _weight_step_load(codes_ptr, w_offs, u0, 32)
        pdl_wait(PDL)  # kernels/pdl.py: the first unit's WEIGHT words above, x and the output only below
        pdl_launch_dependents(PDL)
        for unit in range(u0, u0 + UNITS_SPLIT):
            w_n = _weight_step_load(codes_ptr, w_offs, gl.minimum(unit + 1, last), 32)
            for j in gl.static_range(4):
                acc = _w8_group(
                    acc, w, gl.load(s_ptrs + unit * 4 + j).to(gl.float32)[:, None], x_ptr, unit, i, j, magic
                )
            w = w_n
        _store_rows(out_ptr, acc, 1.0, rows, N)
