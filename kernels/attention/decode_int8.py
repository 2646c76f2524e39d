"""``_paged_attention_decode_int8_kernel``: ``paged_attention_decode`` over int8 KV with the scales taken out of
the tiles (the launcher's ``int8_grouped`` knob; 16-bit queries, head_dim up to 256). The split rule, the grid
and the partial outputs are decode.py's, so ``_paged_attention_reduce_kernel`` merges them as it does the float
kernel's.

Why: decode.py's int8 paths dequantise every K/V code (codes times their group's scale) before the dots: two
extra multiplies a byte on top of the conversion, scales fanned out to every element, and a V tile that goes
through shared memory after its dequantisation. On an H200 that kernel is issue-bound, not memory-bound. Here
each 64-value scale group of a head row is its own dot on the raw codes, converted to fp16 (exact: |code| <=
127), and the scales multiply the dots' small results instead:

- scores: ``score[g, n] = sum_s k_scale[n, s] * (q[g, group s] . k_codes[n, group s])``: one [BLOCK_G,
  BLOCK_N] partial per group, times its keys' scales (BLOCK_G x BLOCK_N multiplies a group, not BLOCK_N x 64).
  No rounding beyond the query's to fp16: the codes are exact, the dot accumulates in fp32.
- values: ``acc[:, group s] += (p * v_scale[:, s] / norm_s) @ v_codes[:, group s]``, one fp32 accumulator a
  group, times ``norm_s`` at the end. ``norm_s``, group s's largest value scale over the split's first tile (a
  function of the split's bounds: batch invariant), keeps the fp16 weights near [0, 1], as the fp16
  probabilities of ``int8_f16`` are: p times a small scale straight to fp16 would fall into fp16's subnormals
  (absolute step 2^-24) when the values are small (a group absmax of 1e-3 makes scales near 2^-17). Each weight
  rounds once to fp16 (2^-11 relative), where ``int8_f16`` rounds both p and the dequantised value. The limit:
  a later tile whose scales reach 65504x the first tile's would overflow the fp16 weights (values 65504x larger
  than the split's first 64 keys' within one split).
- the int8 -> fp16 conversion on the GPU is inline PTX, four codes a 32-bit word (``_codes_to_f16``); K tiles reach
  their dots from the pipeliner's shared int8 copy (8-byte loads along head_dim), V tiles are converted in
  registers and reach theirs in fp16 through a transposing ldmatrix (see ``v_bias`` in the kernel).

sm_90 SASS (bench/kernels/aot_compile.py's build at the 27B launch values, 64-key tiles, 4 warps; static counts of
the loop, ``cuobjdump -sass``), per 64 keys: 1231 instructions in 150 registers, against 1695 in 250 for decode.py's
``int8_f16`` kernel and 1018 for bf16 KV (509 a 32-key tile, 123 registers). Conversions: 363 (PRMT 134, LOP3 69,
HADD2 160) against 849 (PRMT 390, LOP3 203, HADD2 128, HMUL2 128); the per-group weights' and V's passes through
shared memory cost 28 STS/STSM, 90 LDS and 24 LDSM a tile (int8_f16: 25, 65, 24; bf16's 32-key tile: 7, 20, 34);
BAR 16 (12; 9). H200, 100k keys: 128.8 us a layer at batch 1 (bf16 104.7), 358.6 at batch 4 (bf16 387.7).

``_paged_attention_decode_int8_km_kernel`` (``NINFER_INT8_ATTENTION=keys_major``, the launcher's ``int8_keys_major``)
is the same arithmetic transposed, for GQA's few query heads a KV head. The kernel above computes [heads, keys]
scores: the 6 heads of a KV head at 27B are the MMAs' M side, padded to the 16 rows of an ``mma.sync`` m16n8k16.
Keys-major, the keys are the M side (a warp's 16 of the tile's 64) and the heads the N side, padded to 8 (one n8
block): ``scores_t = codes_s @ q_t`` is [keys, heads] with the key scales on its rows, and each group's accumulator
is ``acc_t = codes_s^T @ w_t``, [values, heads], so both dots take half the MMAs (32 HMMA a tile against 64). The
softmax runs down the columns. It launches with a 128-register cap and 2 pipeline stages (INT8_KEYS_MAJOR_LAUNCH in
decode.py). sm_90 loop per 64 keys (bench/kernels/aot_sass.py): 863 instructions in 128 registers, no spills
(sm_120: 851). At 16 columns Triton picks wgmma on sm_90, which costs more here (1329 instructions: its register A
operand needs 358 byte permutes) and spills at 128 registers. Not yet timed on this code; session 10 timed its
build of the idea (lost) at 85.7 us a layer at batch 1, 307.0 at batch 4.
"""

from __future__ import annotations

from kernels._dispatch import HAS_TRITON

if HAS_TRITON:
    import triton
    import triton.language as tl

    from kernels.pdl import pdl_launch_dependents, pdl_wait

    @triton.jit
    def _codes_to_f16(codes, bias, ASM: tl.constexpr):
        # int8 -> fp16, exactly, without the conversion unit: byte ^ 0x80 is code + 128, and 0x64 above it makes the
        # fp16 1024 + code + 128; minus 1152 is the code. ASM (on the GPU): four codes a 32-bit word, one xor, two
        # byte permutes and two half2 subtractions of ``bias`` (int32 0x64806480, fp16 1152 twice; a tensor, or
        # the constant; see ``v_bias`` in the kernel for why a tensor); else (the interpreter, which runs no PTX) the same per
        # element, 2.5 instructions a code as the compiler builds it (_dequantize_tile_f16's trick).
        if ASM:
            return tl.inline_asm_elementwise(
                """{
                .reg .b32 t, hi;
                xor.b32 t, $2, 0x80808080;
                mov.b32 hi, 0x64646464;
                prmt.b32 $0, t, hi, 0x5140;
                prmt.b32 $1, t, hi, 0x5342;
                sub.f16x2 $0, $0, $3;
                sub.f16x2 $1, $1, $3;
                }""",
                "=r,=r,r,r,r,r,r",
                [codes, tl.full(codes.shape, 0, tl.int32) + bias],
                dtype=tl.float16,
                is_pure=True,
                pack=4,
            )
        else:
            biased = codes.to(tl.uint8, bitcast=True).to(tl.uint16) ^ 0x6480
            return biased.to(tl.float16, bitcast=True) - 1152.0

    @triton.jit
    def _group_codes(
        cache_ptr,
        kv_rows,
        t_mask,
        COL0: tl.constexpr,
        GROUP_D: tl.constexpr,
        BLOCK_DG: tl.constexpr,
        ASM: tl.constexpr,
        bias,
    ):
        # codes of one scale group (columns COL0 .. COL0 + GROUP_D) of the tile's rows -> fp16 [BLOCK_N, BLOCK_DG]
        offs = tl.arange(0, BLOCK_DG)
        codes = tl.load(
            cache_ptr + kv_rows[:, None] + (COL0 + offs)[None, :],
            mask=t_mask[:, None] & (offs < GROUP_D)[None, :],
            other=0,
        )
        return _codes_to_f16(codes, bias, ASM)

    @triton.jit
    def _group_scores(
        scores,
        q_s,
        key_cache_ptr,
        k_scale,
        kv_rows,
        t_mask,
        scale_log2,
        S: tl.constexpr,
        GROUP_D: tl.constexpr,
        BLOCK_DG: tl.constexpr,
        ASM: tl.constexpr,
    ):
        # scores + k_scale * (q_s @ codes_S^T) * scale_log2 (k_scale: group S's [BLOCK_N] key scales), log2 domain: [BLOCK_G, BLOCK_N] fp32
        codes = _group_codes(key_cache_ptr, kv_rows, t_mask, S * GROUP_D, GROUP_D, BLOCK_DG, ASM, 0x64806480)
        k_scale = k_scale * scale_log2
        return scores + tl.dot(q_s, tl.trans(codes)) * k_scale[None, :]

    @triton.jit
    def _group_values(
        acc_s,
        p,
        alpha,
        value_cache_ptr,
        v_scale,
        kv_rows,
        t_mask,
        inv_norm,
        v_bias,
        S: tl.constexpr,
        GROUP_D: tl.constexpr,
        BLOCK_DG: tl.constexpr,
        ASM: tl.constexpr,
    ):
        # acc_s * alpha + (p * v_scale * inv_norm) @ codes_S (v_scale: group S's [BLOCK_N] value scales): [BLOCK_G, BLOCK_DG] fp32, the weights in fp16
        v_scale = v_scale * inv_norm
        w = (p * v_scale[None, :]).to(tl.float16)
        codes = _group_codes(value_cache_ptr, kv_rows, t_mask, S * GROUP_D, GROUP_D, BLOCK_DG, ASM, v_bias)
        return acc_s * alpha[:, None] + tl.dot(w, codes)

    @triton.jit
    def _tile_scales(
        scale_ptr,
        scale_rows,
        t_mask,
        NUM_SCALES: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        BLOCK_N: tl.constexpr,
    ):
        # the tile's scales of every group in one load ([BLOCK_N, BLOCK_SCALES] fp16: 8 bytes a row at 4 groups),
        # split in registers into one fp32 [BLOCK_N] vector a group (past BLOCK_SCALES groups: copies, unused)
        offs_s = tl.arange(0, BLOCK_SCALES)
        scales = tl.load(
            scale_ptr + scale_rows[:, None] + offs_s[None, :],
            mask=t_mask[:, None] & (offs_s < NUM_SCALES)[None, :],
            other=0.0,
        ).to(tl.float32)
        if BLOCK_SCALES == 1:
            s0 = tl.reshape(scales, (BLOCK_N,))
            return s0, s0, s0, s0
        elif BLOCK_SCALES == 2:
            s0, s1 = tl.split(scales)
            return s0, s1, s0, s1
        else:
            even, odd = tl.split(tl.reshape(scales, (BLOCK_N, 2, 2)))  # even: groups 0 and 2, odd: 1 and 3
            s0, s2 = tl.split(even)
            s1, s3 = tl.split(odd)
            return s0, s1, s2, s3

    @triton.jit
    def _value_norm(value_scale_ptr, scale_rows, t_mask, S: tl.constexpr):
        # the largest value scale of group S over the split's first tile (1 if they are all 0)
        v_max = tl.max(
            tl.load(value_scale_ptr + scale_rows + S, mask=t_mask, other=0.0).to(tl.float32), axis=0
        )
        return tl.where(v_max > 0.0, v_max, 1.0)

    @triton.jit
    def _value_norms(value_scale_ptr, scale_rows, t_mask, NUM_SCALES: tl.constexpr):
        # _value_norm of each of the NUM_SCALES groups (past them: copies of group 0's, unused)
        norm0 = _value_norm(value_scale_ptr, scale_rows, t_mask, 0)
        norm1 = norm0
        norm2 = norm0
        norm3 = norm0
        if NUM_SCALES > 1:
            norm1 = _value_norm(value_scale_ptr, scale_rows, t_mask, 1)
        if NUM_SCALES > 2:
            norm2 = _value_norm(value_scale_ptr, scale_rows, t_mask, 2)
        if NUM_SCALES > 3:
            norm3 = _value_norm(value_scale_ptr, scale_rows, t_mask, 3)
        return norm0, norm1, norm2, norm3

    @triton.jit
    def _tile_rows(
        page_row_ptr, toks, t_mask, kv_head, cache_stride_page, cache_stride_row, cache_stride_head,
        scale_stride_page, scale_stride_row, scale_stride_head, PAGE_SIZE: tl.constexpr,
    ):  # fmt: skip
        # the offsets of keys ``toks``' head rows in the caches and in the scales (page_row_ptr: the sequence's
        # page-table row), int64: ([BLOCK_N], [BLOCK_N])
        pages = tl.load(page_row_ptr + toks // PAGE_SIZE, mask=t_mask, other=0).to(tl.int64)
        rows = toks % PAGE_SIZE
        kv_rows = pages * cache_stride_page + rows * cache_stride_row + kv_head * cache_stride_head
        scale_rows = pages * scale_stride_page + rows * scale_stride_row + kv_head * scale_stride_head
        return kv_rows, scale_rows

    @triton.jit
    def _store_group(
        part_out_ptr, part, acc_s, inv_l, g_mask, COL0: tl.constexpr, GROUP_D: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_DG: tl.constexpr,
    ):  # fmt: skip
        offs = tl.arange(0, BLOCK_DG)
        tl.store(
            part_out_ptr + part[:, None] * HEAD_DIM + (COL0 + offs)[None, :],
            acc_s * inv_l[:, None],
            mask=g_mask[:, None] & (offs < GROUP_D)[None, :],
        )

    @triton.jit
    def _paged_attention_decode_int8_kernel(
        q_ptr,
        key_cache_ptr,
        value_cache_ptr,
        key_scale_ptr,
        value_scale_ptr,
        page_table_ptr,
        seq_lens_ptr,
        part_out_ptr,
        part_lse_ptr,
        q_stride_b,
        q_stride_h,
        cache_stride_page,
        cache_stride_row,
        cache_stride_head,
        scale_stride_page,
        scale_stride_row,
        scale_stride_head,
        page_table_stride,
        part_splits,
        scale_log2,
        NUM_Q_HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE_SIZE: tl.constexpr,
        NUM_SCALES: tl.constexpr,
        SPLIT_UNIT: tl.constexpr,
        MAX_SPLITS: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_DG: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        ASM: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # grid (B, Hkv, part_splits), as decode.py's _paged_attention_decode_kernel (same split rule, same partial
        # outputs), over int8 codes with NUM_SCALES (1..4) scale groups of GROUP_D = HEAD_DIM // NUM_SCALES columns
        # (padded to BLOCK_DG): the query, the value accumulator and the stores are one tensor a group, each group
        # a constexpr-guarded copy (acc1..acc3 stay unused below 4 groups).
        GROUP_D: tl.constexpr = HEAD_DIM // NUM_SCALES
        pdl_wait(PDL)  # kernels/pdl.py: first, as in decode.py (seq_lens, pages, query: a predecessor's)
        pdl_launch_dependents(PDL)
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + row)
        units = (seq_len + SPLIT_UNIT - 1) // SPLIT_UNIT  # decode_split_tokens, as in decode.py's kernels
        split_tokens = tl.maximum((units + MAX_SPLITS - 1) // MAX_SPLITS, 1) * SPLIT_UNIT
        start = split * split_tokens
        if start >= seq_len:
            return
        end = tl.minimum(start + split_tokens, seq_len)
        offs_g = tl.arange(0, BLOCK_G)
        offs_dg = tl.arange(0, BLOCK_DG)
        g_mask = offs_g < GROUP
        heads = kv_head * GROUP + offs_g
        q_rows = q_ptr + row * q_stride_b + heads[:, None] * q_stride_h + offs_dg[None, :]
        q_mask = g_mask[:, None] & (offs_dg < GROUP_D)[None, :]
        # the query in fp16, clamped to its range (as int8_f16): one [BLOCK_G, BLOCK_DG] operand a group
        q0 = tl.load(q_rows, mask=q_mask, other=0.0).to(tl.float32)
        q0 = tl.minimum(tl.maximum(q0, -65504.0), 65504.0).to(tl.float16)
        q1 = q0
        q2 = q0
        q3 = q0
        if NUM_SCALES > 1:
            q1 = tl.load(q_rows + GROUP_D, mask=q_mask, other=0.0).to(tl.float32)
            q1 = tl.minimum(tl.maximum(q1, -65504.0), 65504.0).to(tl.float16)
        if NUM_SCALES > 2:
            q2 = tl.load(q_rows + 2 * GROUP_D, mask=q_mask, other=0.0).to(tl.float32)
            q2 = tl.minimum(tl.maximum(q2, -65504.0), 65504.0).to(tl.float16)
        if NUM_SCALES > 3:
            q3 = tl.load(q_rows + 3 * GROUP_D, mask=q_mask, other=0.0).to(tl.float32)
            q3 = tl.minimum(tl.maximum(q3, -65504.0), 65504.0).to(tl.float16)
        m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l_sum = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc0 = tl.zeros([BLOCK_G, BLOCK_DG], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_G, BLOCK_DG], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_G, BLOCK_DG], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_G, BLOCK_DG], dtype=tl.float32)
        # the weights' normalisers: each group's largest value scale over the split's first tile (a function of the
        # split's bounds only: batch invariant)
        toks = start + tl.arange(0, BLOCK_N)
        t_mask = toks < end
        _, scale_rows = _tile_rows(
            page_table_ptr + row * page_table_stride, toks, t_mask, kv_head, cache_stride_page, cache_stride_row,
            cache_stride_head, scale_stride_page, scale_stride_row, scale_stride_head, PAGE_SIZE,
        )  # fmt: skip
        norm0, norm1, norm2, norm3 = _value_norms(value_scale_ptr, scale_rows, t_mask, NUM_SCALES)
        inv_norm0 = 1.0 / norm0
        inv_norm1 = 1.0 / norm1
        inv_norm2 = 1.0 / norm2
        inv_norm3 = 1.0 / norm3
        # 0x64806480 (fp16 1152 twice, _codes_to_f16's bias) as a run-time value the compiler cannot fold (seq_len
        # >= 0): an operand from outside the V tile keeps Triton's pipeliner from copying the int8 V tile into shared
        # memory for the P @ V dot, whose operand pairs keys across rows, which a shared int8 tile gives byte by
        # byte (128 LDS.U8 a thread and tile at 27B). Loaded into registers instead, converted there, V reaches the
        # dot in fp16 through shared memory and 16-bit transposing ldmatrix (sm_90 loop: 1442 -> 1231 instructions).
        v_bias = 0x64806480 + tl.minimum(seq_len, 0)
        for tok0 in range(start, end, BLOCK_N):
            toks = tok0 + tl.arange(0, BLOCK_N)
            t_mask = toks < end
            kv_rows, scale_rows = _tile_rows(
                page_table_ptr + row * page_table_stride, toks, t_mask, kv_head, cache_stride_page,
                cache_stride_row, cache_stride_head, scale_stride_page, scale_stride_row, scale_stride_head, PAGE_SIZE,
            )  # fmt: skip
            ks0, ks1, ks2, ks3 = _tile_scales(
                key_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N
            )
            scores = tl.zeros([BLOCK_G, BLOCK_N], dtype=tl.float32)
            scores = _group_scores(
                scores, q0, key_cache_ptr, ks0, kv_rows, t_mask, scale_log2, 0, GROUP_D, BLOCK_DG, ASM
            )
            if NUM_SCALES > 1:
                scores = _group_scores(
                    scores, q1, key_cache_ptr, ks1, kv_rows, t_mask, scale_log2, 1, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            if NUM_SCALES > 2:
                scores = _group_scores(
                    scores, q2, key_cache_ptr, ks2, kv_rows, t_mask, scale_log2, 2, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            if NUM_SCALES > 3:
                scores = _group_scores(
                    scores, q3, key_cache_ptr, ks3, kv_rows, t_mask, scale_log2, 3, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            scores = tl.where(t_mask[None, :], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=1))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(scores - m_new[:, None])
            l_sum = l_sum * alpha + tl.sum(p, axis=1)
            vs0, vs1, vs2, vs3 = _tile_scales(
                value_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N
            )
            acc0 = _group_values(
                acc0,
                p,
                alpha,
                value_cache_ptr,
                vs0,
                kv_rows,
                t_mask,
                inv_norm0,
                v_bias,
                0,
                GROUP_D,
                BLOCK_DG,
                ASM,
            )
            if NUM_SCALES > 1:
                acc1 = _group_values(
                    acc1, p, alpha, value_cache_ptr, vs1, kv_rows, t_mask, inv_norm1, v_bias, 1, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            if NUM_SCALES > 2:
                acc2 = _group_values(
                    acc2, p, alpha, value_cache_ptr, vs2, kv_rows, t_mask, inv_norm2, v_bias, 2, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            if NUM_SCALES > 3:
                acc3 = _group_values(
                    acc3, p, alpha, value_cache_ptr, vs3, kv_rows, t_mask, inv_norm3, v_bias, 3, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            m = m_new
        part = (row * NUM_Q_HEADS + heads) * part_splits + split  # [BLOCK_G]
        inv_l = 1.0 / tl.maximum(l_sum, 1e-30)
        _store_group(part_out_ptr, part, acc0, inv_l * norm0, g_mask, 0, GROUP_D, HEAD_DIM, BLOCK_DG)
        if NUM_SCALES > 1:
            _store_group(
                part_out_ptr, part, acc1, inv_l * norm1, g_mask, GROUP_D, GROUP_D, HEAD_DIM, BLOCK_DG
            )
        if NUM_SCALES > 2:
            _store_group(
                part_out_ptr, part, acc2, inv_l * norm2, g_mask, 2 * GROUP_D, GROUP_D, HEAD_DIM, BLOCK_DG
            )
        if NUM_SCALES > 3:
            _store_group(
                part_out_ptr, part, acc3, inv_l * norm3, g_mask, 3 * GROUP_D, GROUP_D, HEAD_DIM, BLOCK_DG
            )
        tl.store(part_lse_ptr + part, m + tl.log2(l_sum), mask=g_mask)

    # -------------------------------------------------------------------------------------------------
    # keys-major (NINFER_INT8_ATTENTION=keys_major): the same math, transposed

    @triton.jit
    def _group_scores_km(
        scores_t,
        q_t,
        key_cache_ptr,
        k_scale,
        kv_rows,
        t_mask,
        scale_log2,
        S: tl.constexpr,
        GROUP_D: tl.constexpr,
        BLOCK_DG: tl.constexpr,
        ASM: tl.constexpr,
    ):
        # scores_t + (codes_S @ q_t) * k_scale * scale_log2: [BLOCK_N, BLOCK_G] fp32, the keys' scales on its rows
        codes = _group_codes(key_cache_ptr, kv_rows, t_mask, S * GROUP_D, GROUP_D, BLOCK_DG, ASM, 0x64806480)
        k_scale = k_scale * scale_log2
        return scores_t + tl.dot(codes, q_t) * k_scale[:, None]

    @triton.jit
    def _group_values_km(
        acc_t,
        p_t,
        alpha,
        value_cache_ptr,
        v_scale,
        kv_rows,
        t_mask,
        inv_norm,
        v_bias,
        S: tl.constexpr,
        GROUP_D: tl.constexpr,
        BLOCK_DG: tl.constexpr,
        ASM: tl.constexpr,
    ):
        # acc_t * alpha + codes_S^T @ (p_t * v_scale * inv_norm): [BLOCK_DG, BLOCK_G] fp32, the weights in fp16
        v_scale = v_scale * inv_norm
        w_t = (p_t * v_scale[:, None]).to(tl.float16)
        codes = _group_codes(value_cache_ptr, kv_rows, t_mask, S * GROUP_D, GROUP_D, BLOCK_DG, ASM, v_bias)
        return acc_t * alpha[None, :] + tl.dot(tl.trans(codes), w_t)

    @triton.jit
    def _store_group_km(
        part_out_ptr, part, acc_t, inv_l, g_mask, COL0: tl.constexpr, GROUP_D: tl.constexpr, HEAD_DIM: tl.constexpr,
        BLOCK_DG: tl.constexpr,
    ):  # fmt: skip
        offs = tl.arange(0, BLOCK_DG)
        tl.store(
            part_out_ptr + part[None, :] * HEAD_DIM + (COL0 + offs)[:, None],
            acc_t * inv_l[None, :],
            mask=g_mask[None, :] & (offs < GROUP_D)[:, None],
        )

    @triton.jit
    def _load_query_t(q_cols, q_mask, COL0: tl.constexpr):
        # one scale group of the query heads, transposed ([BLOCK_DG, BLOCK_G]), in fp16 clamped to its range
        q = tl.load(q_cols + COL0, mask=q_mask, other=0.0).to(tl.float32)
        return tl.minimum(tl.maximum(q, -65504.0), 65504.0).to(tl.float16)

    @triton.jit
    def _paged_attention_decode_int8_km_kernel(
        q_ptr,
        key_cache_ptr,
        value_cache_ptr,
        key_scale_ptr,
        value_scale_ptr,
        page_table_ptr,
        seq_lens_ptr,
        part_out_ptr,
        part_lse_ptr,
        q_stride_b,
        q_stride_h,
        cache_stride_page,
        cache_stride_row,
        cache_stride_head,
        scale_stride_page,
        scale_stride_row,
        scale_stride_head,
        page_table_stride,
        part_splits,
        scale_log2,
        NUM_Q_HEADS: tl.constexpr,
        GROUP: tl.constexpr,
        HEAD_DIM: tl.constexpr,
        PAGE_SIZE: tl.constexpr,
        NUM_SCALES: tl.constexpr,
        SPLIT_UNIT: tl.constexpr,
        MAX_SPLITS: tl.constexpr,
        BLOCK_G: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_DG: tl.constexpr,
        BLOCK_SCALES: tl.constexpr,
        ASM: tl.constexpr,
        PDL: tl.constexpr,
    ):
        # _paged_attention_decode_int8_kernel transposed (grid, splits, partial outputs and arithmetic the same):
        # the keys are the MMAs' rows and the GROUP query heads their columns (BLOCK_G = 8 at GQA up to 8).
        # scores_t = codes @ q_t is [BLOCK_N, BLOCK_G], the key scales multiply its rows; each group's
        # accumulator is acc_t = codes^T @ w_t, [BLOCK_DG, BLOCK_G]; the softmax runs down the columns.
        GROUP_D: tl.constexpr = HEAD_DIM // NUM_SCALES
        pdl_wait(PDL)  # kernels/pdl.py: first, as in decode.py (seq_lens, pages, query: a predecessor's)
        pdl_launch_dependents(PDL)
        row = tl.program_id(0)
        kv_head = tl.program_id(1)
        split = tl.program_id(2)
        seq_len = tl.load(seq_lens_ptr + row)
        units = (seq_len + SPLIT_UNIT - 1) // SPLIT_UNIT  # decode_split_tokens, as in decode.py's kernels
        split_tokens = tl.maximum((units + MAX_SPLITS - 1) // MAX_SPLITS, 1) * SPLIT_UNIT
        start = split * split_tokens
        if start >= seq_len:
            return
        end = tl.minimum(start + split_tokens, seq_len)
        offs_g = tl.arange(0, BLOCK_G)
        offs_dg = tl.arange(0, BLOCK_DG)
        g_mask = offs_g < GROUP
        heads = kv_head * GROUP + offs_g
        q_cols = q_ptr + row * q_stride_b + heads[None, :] * q_stride_h + offs_dg[:, None]
        q_mask = g_mask[None, :] & (offs_dg < GROUP_D)[:, None]
        q0 = _load_query_t(q_cols, q_mask, 0)
        q1 = q0
        q2 = q0
        q3 = q0
        if NUM_SCALES > 1:
            q1 = _load_query_t(q_cols, q_mask, GROUP_D)
        if NUM_SCALES > 2:
            q2 = _load_query_t(q_cols, q_mask, 2 * GROUP_D)
        if NUM_SCALES > 3:
            q3 = _load_query_t(q_cols, q_mask, 3 * GROUP_D)
        m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        # the softmax's denominators, summed over the keys once at the end: each [key row, head] entry holds its
        # row's share (rescaled with the accumulators), so the loop has one cross-warp reduction (the max), not two
        l_t = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
        acc0 = tl.zeros([BLOCK_DG, BLOCK_G], dtype=tl.float32)
        acc1 = tl.zeros([BLOCK_DG, BLOCK_G], dtype=tl.float32)
        acc2 = tl.zeros([BLOCK_DG, BLOCK_G], dtype=tl.float32)
        acc3 = tl.zeros([BLOCK_DG, BLOCK_G], dtype=tl.float32)
        # the weights' normalisers, as in _paged_attention_decode_int8_kernel
        toks = start + tl.arange(0, BLOCK_N)
        t_mask = toks < end
        _, scale_rows = _tile_rows(
            page_table_ptr + row * page_table_stride, toks, t_mask, kv_head, cache_stride_page, cache_stride_row,
            cache_stride_head, scale_stride_page, scale_stride_row, scale_stride_head, PAGE_SIZE,
        )  # fmt: skip
        norm0, norm1, norm2, norm3 = _value_norms(value_scale_ptr, scale_rows, t_mask, NUM_SCALES)
        inv_norm0 = 1.0 / norm0
        inv_norm1 = 1.0 / norm1
        inv_norm2 = 1.0 / norm2
        inv_norm3 = 1.0 / norm3
        v_bias = 0x64806480 + tl.minimum(seq_len, 0)  # see _paged_attention_decode_int8_kernel
        for tok0 in range(start, end, BLOCK_N):
            toks = tok0 + tl.arange(0, BLOCK_N)
            t_mask = toks < end
            kv_rows, scale_rows = _tile_rows(
                page_table_ptr + row * page_table_stride, toks, t_mask, kv_head, cache_stride_page,
                cache_stride_row, cache_stride_head, scale_stride_page, scale_stride_row, scale_stride_head, PAGE_SIZE,
            )  # fmt: skip
            ks0, ks1, ks2, ks3 = _tile_scales(
                key_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N
            )
            scores = tl.zeros([BLOCK_N, BLOCK_G], dtype=tl.float32)
            scores = _group_scores_km(
                scores, q0, key_cache_ptr, ks0, kv_rows, t_mask, scale_log2, 0, GROUP_D, BLOCK_DG, ASM
            )
            if NUM_SCALES > 1:
                scores = _group_scores_km(
                    scores, q1, key_cache_ptr, ks1, kv_rows, t_mask, scale_log2, 1, GROUP_D, BLOCK_DG, ASM
                )
            if NUM_SCALES > 2:
                scores = _group_scores_km(
                    scores, q2, key_cache_ptr, ks2, kv_rows, t_mask, scale_log2, 2, GROUP_D, BLOCK_DG, ASM
                )
            if NUM_SCALES > 3:
                scores = _group_scores_km(
                    scores, q3, key_cache_ptr, ks3, kv_rows, t_mask, scale_log2, 3, GROUP_D, BLOCK_DG, ASM
                )
            scores = tl.where(t_mask[:, None], scores, float("-inf"))
            m_new = tl.maximum(m, tl.max(scores, axis=0))
            alpha = tl.exp2(m - m_new)
            p = tl.exp2(scores - m_new[None, :])
            l_t = l_t * alpha[None, :] + p
            vs0, vs1, vs2, vs3 = _tile_scales(
                value_scale_ptr, scale_rows, t_mask, NUM_SCALES, BLOCK_SCALES, BLOCK_N
            )
            acc0 = _group_values_km(
                acc0, p, alpha, value_cache_ptr, vs0, kv_rows, t_mask, inv_norm0, v_bias, 0, GROUP_D,
                BLOCK_DG, ASM,
            )  # fmt: skip
            if NUM_SCALES > 1:
                acc1 = _group_values_km(
                    acc1, p, alpha, value_cache_ptr, vs1, kv_rows, t_mask, inv_norm1, v_bias, 1, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            if NUM_SCALES > 2:
                acc2 = _group_values_km(
                    acc2, p, alpha, value_cache_ptr, vs2, kv_rows, t_mask, inv_norm2, v_bias, 2, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            if NUM_SCALES > 3:
                acc3 = _group_values_km(
                    acc3, p, alpha, value_cache_ptr, vs3, kv_rows, t_mask, inv_norm3, v_bias, 3, GROUP_D,
                    BLOCK_DG, ASM,
                )  # fmt: skip
            m = m_new
        part = (row * NUM_Q_HEADS + heads) * part_splits + split  # [BLOCK_G]
        l_sum = tl.sum(l_t, axis=0)
        inv_l = 1.0 / tl.maximum(l_sum, 1e-30)
        _store_group_km(part_out_ptr, part, acc0, inv_l * norm0, g_mask, 0, GROUP_D, HEAD_DIM, BLOCK_DG)
        if NUM_SCALES > 1:
            _store_group_km(
                part_out_ptr, part, acc1, inv_l * norm1, g_mask, GROUP_D, GROUP_D, HEAD_DIM, BLOCK_DG
            )
        if NUM_SCALES > 2:
            _store_group_km(
                part_out_ptr, part, acc2, inv_l * norm2, g_mask, 2 * GROUP_D, GROUP_D, HEAD_DIM, BLOCK_DG
            )
        if NUM_SCALES > 3:
            _store_group_km(
                part_out_ptr, part, acc3, inv_l * norm3, g_mask, 3 * GROUP_D, GROUP_D, HEAD_DIM, BLOCK_DG
            )
        tl.store(part_lse_ptr + part, m + tl.log2(l_sum), mask=g_mask)
