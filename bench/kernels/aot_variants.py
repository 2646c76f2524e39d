"""AOT launch values of the kernels in ``kernels/`` (all but kernels/quant/, which bench/kernels/aot_quant.py
holds), for bench/kernels/aot_compile.py: the ``Variant`` record and the ``VARIANTS`` table, keyed by kernel
name. Imports nothing of the project and no triton (aot_compile.py runs in the torch-free tools venv and loads
this file by path).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """One launch configuration of a kernel: what its launcher passes at the 27B geometry.

    ptrs: element type of every pointer arg (Triton's names: bf16, fp32, i64, i1, ...); floats: the
    scalar args that are Python floats (fp32); every other non-constexpr arg is an int (i32). Pointers are
    compiled as 16-byte aligned; aligned: the int args that are multiples of 16 at the launch, as Triton's
    JIT specializes them (strides of the real shapes: what enables 16-byte vector and async copies). maxnreg: the
    launch's register cap (Triton's ``maxnreg`` option, ptx ``.maxnreg``), None for ptxas's own choice.
    """

    label: str
    ptrs: dict[str, str]
    constexprs: dict[str, int | bool]
    floats: tuple[str, ...] = ()
    aligned: tuple[str, ...] = ()
    num_warps: int = 4
    num_stages: int = 3
    maxnreg: int | None = None


# ---------------------------------------------------------------------------------------------------
# What the launchers pass at the Qwen3.6-27B geometry (engine/testing/synthetic.py GEOMETRIES["qwen3.6-27b"]):
# hidden 5120, attention 24 q / 4 kv heads x 256, GDN 16 k / 48 v heads x 128, conv kernel 4, page size 64,
# bf16 activations, weights and caches, fp32 GDN state, int64 slots, bool flags, int32 page tables.

_NORM_PTRS = {p: "bf16" for p in ("x_ptr", "res_ptr", "gate_ptr", "w_ptr", "out_ptr", "sum_ptr")}
# paged_attention_decode: at most DECODE_MAX_SPLITS = 128 splits a sequence (the reduce's BLOCK_S), split unit
# = BLOCK_N = 32 keys at head_dim 256; the int8 cache has 256 / 64 = 4 fp16 scales a head row
_ATTN_SPLITS = 128
_STORE_KV_PTRS = {"key_ptr": "bf16", "value_ptr": "bf16", "slot_mapping_ptr": "i64"}
_DECODE_PTRS = {"q_ptr": "bf16", "page_table_ptr": "i32", "seq_lens_ptr": "i32", "part_out_ptr": "fp32",
                "part_lse_ptr": "fp32"}  # fmt: skip
_PREFILL_PTRS = {"q_ptr": "bf16", "page_table_ptr": "i32", "query_start_loc_ptr": "i32", "seq_lens_ptr": "i32",
                 "out_ptr": "bf16"}  # fmt: skip
_PREFILL_27B = dict(GROUP=6, HEAD_DIM=256, PAGE_SIZE=64, BLOCK_D=256)
# The strides Triton's launcher specialises as multiples of 16 at run time (1024-element rows, 256-element heads,
# 16 scale bytes a row): without them here the AOT build would load int8 K/V byte by byte, unlike the JIT's.
_DECODE_ALIGNED = ("q_stride_b", "q_stride_h", "cache_stride_page", "cache_stride_row", "cache_stride_head",
                   "scale_stride_page", "scale_stride_row")  # fmt: skip
_FUSE_ALIGNED = ("dim", "q_stride_t", "q_stride_h", "k_stride_t", "k_stride_h", "v_stride_t", "v_stride_h",
                 "cos_stride", "sin_stride", "cache_stride_slot", "cache_stride_head")  # fmt: skip
_DECODE_27B = dict(NUM_Q_HEADS=24, GROUP=6, HEAD_DIM=256, PAGE_SIZE=64, SPLIT_UNIT=32, MAX_SPLITS=_ATTN_SPLITS,
                   BLOCK_G=16, BLOCK_N=32, BLOCK_D=256)  # fmt: skip

_DECODE_INT8_PTRS = {**_DECODE_PTRS, "key_cache_ptr": "i8", "value_cache_ptr": "i8", "key_scale_ptr": "fp16",
                     "value_scale_ptr": "fp16"}  # fmt: skip
_DECODE_INT8_27B = dict(NUM_Q_HEADS=24, GROUP=6, HEAD_DIM=256, PAGE_SIZE=64, NUM_SCALES=4, SPLIT_UNIT=64,
                        MAX_SPLITS=_ATTN_SPLITS, BLOCK_G=16, BLOCK_N=64, BLOCK_DG=64, BLOCK_SCALES=4, ASM=True)  # fmt: skip

VARIANTS: dict[str, list[Variant]] = {
    # kernels/activation.py silu_mul (silu_mul_tiles): BLOCK_COLS = min(1024, next_pow2(I)), BLOCK_ROWS =
    # 1024 // BLOCK_COLS, 4 warps; the 27B dense MLP (I = 17408) and the 35B-A3B shared expert (I_s = 512)
    "_silu_mul_kernel": [
        Variant(
            f"I={inter} bf16",
            dict(gate_ptr="bf16", up_ptr="bf16", out_ptr="bf16"),
            dict(BLOCK_ROWS=block_rows, BLOCK_COLS=block_cols),
        )
        for inter, block_rows, block_cols in ((17408, 1, 1024), (512, 2, 512))
    ],
    # kernels/activation.py sigmoid_gate_mul (sigmoid_gate_mul_tiles): BLOCK_COLS = min(1024, next_pow2(D)),
    # BLOCK_ROWS = 1024 // BLOCK_COLS, 4 warps; attention's output gate at 24 heads x 256
    "_sigmoid_gate_mul_kernel": [
        Variant(
            "H=24 D=256 bf16",
            dict(x_ptr="bf16", gate_ptr="bf16", out_ptr="bf16"),
            dict(BLOCK_ROWS=4, BLOCK_COLS=256),
        ),
    ],
    # kernels/linear.py linear (gemv_tiles for bf16): BLOCK_N 32, BLOCK_K 256, 4 warps, 4 pipeline stages; T is a
    # run-time argument (one compiled kernel for T = 1..8), K_SPLIT = K / SPLIT_K. 27B: K 5120 (qkv, GDN in_proj,
    # MLP gate_up, lm_head), 6144 (o_proj, GDN out_proj), 17408 (MLP down), unsplit (bf16 out); 35B-A3B: K 2048
    # (qkv, in_proj, lm_head) unsplit, o_proj / out_proj [2048, 4096] split in 2 and the router [256, 2048] in
    # 8 (fp32 partials)
    "_linear_gemv_kernel": [
        Variant(
            f"{what} K_SPLIT={k // split}{'' if aligned else ' strides not multiples of 16'}",
            dict(
                x_ptr="bf16",
                w_ptr="bf16",
                out_ptr="fp32" if split > 1 else "bf16",
                count_ptr="i32",
                final_ptr="bf16",
            ),  # fmt: skip
            dict(
                K_SPLIT=k // split,
                SPLIT_K=split,
                LAST_REDUCES=last,
                BLOCK_N=32,
                BLOCK_K=256,
                NUM_STAGES=4,
                IEEE=False,
            ),  # fmt: skip
            aligned=("x_stride", "w_stride") if aligned else (),
            num_stages=4,
        )
        for what, k, split, aligned, last in (
            ("27B K=5120", 5120, 1, True, False),
            ("27B K=6144", 6144, 1, True, False),
            ("27B K=17408", 17408, 1, True, False),
            ("35B-A3B K=2048", 2048, 1, True, False),
            ("35B-A3B o_proj 2048x4096 split 2", 4096, 2, True, False),
            ("35B-A3B router 256x2048 split 8", 2048, 8, True, False),
            # NINFER_SPLITK_REDUCE=last: the last split of a row tile sums the partials (no reduce launch)
            ("35B-A3B o_proj 2048x4096 split 2 last reduces", 4096, 2, True, True),
            ("35B-A3B router 256x2048 split 8 last reduces", 2048, 8, True, True),
            (
                "27B K=6144",
                6144,
                1,
                False,
                False,
            ),  # the fallback Triton compiles for odd strides (no async copies)
        )
    ],
    # the split-K reduce: REDUCE_BLOCK 1024, SPLIT_K 2 (35B-A3B o_proj / out_proj) and 8 (its router)
    "_linear_reduce_kernel": [
        Variant(
            f"SPLIT_K={split} bf16 out",
            dict(part_ptr="fp32", out_ptr="bf16"),
            dict(SPLIT_K=split, BLOCK=1024),
        )
        for split in (2, 8)
    ],
    # kernels/norm.py _launch_rms_norm: BLOCK_D = next_pow2(D), BLOCK_ROWS = max(1, min(16, 2048 // BLOCK_D)),
    # num_warps 8 when BLOCK_D >= 4096
    "_rms_norm_kernel": [
        Variant(
            "add_rms_norm D=5120",
            _NORM_PTRS,
            dict(HAS_RESIDUAL=True, HAS_GATE=False, ONE_PLUS_WEIGHT=True, BLOCK_ROWS=1, BLOCK_D=8192),
            floats=("eps",),
            num_warps=8,
        ),
        Variant(
            "rms_norm q/k heads D=256",
            _NORM_PTRS,
            dict(HAS_RESIDUAL=False, HAS_GATE=False, ONE_PLUS_WEIGHT=True, BLOCK_ROWS=8, BLOCK_D=256),
            floats=("eps",),
        ),
        Variant(
            "gated_rms_norm GDN D=128",
            _NORM_PTRS,
            dict(HAS_RESIDUAL=False, HAS_GATE=True, ONE_PLUS_WEIGHT=False, BLOCK_ROWS=16, BLOCK_D=128),
            floats=("eps",),
        ),
    ],
    # kernels/conv.py causal_conv1d_decode: C = 2 * 16 * 128 + 48 * 128 = 10240, K = 4, BLOCK_C = 256
    "_causal_conv1d_decode_kernel": [
        Variant(
            "decode K=4 silu",
            dict(
                x_ptr="bf16",
                w_ptr="bf16",
                states_ptr="bf16",
                slots_ptr="i64",
                out_slots_ptr="i64",
                keep_ptr="i1",
                out_ptr="bf16",
            ),
            dict(KERNEL=4, SILU=True, BLOCK_C=256),
        ),
    ],
    # kernels/conv.py causal_conv1d_varlen(_split): BLOCK_T = 32, BLOCK_C = 128 (divides the q | k | v split
    # points 2048 and 4096), BLOCK_K = next_pow2(K - 1), SEARCH_STEPS = ceil(log2(B)): 0 for one sequence
    "_causal_conv1d_varlen_kernel": [
        Variant(
            f"prefill K=4 silu B={batch}",
            dict(
                x_ptr="bf16",
                w_ptr="bf16",
                states_ptr="bf16",
                cu_seqlens_ptr="i32",
                slots_ptr="i64",
                keep_ptr="i1",
                out_ptr="bf16",
            ),
            dict(KERNEL=4, SILU=True, BLOCK_T=32, BLOCK_C=128, BLOCK_K=4, SEARCH_STEPS=steps),
            num_warps=4,
        )
        for batch, steps in ((1, 0), (8, 3))
    ],
    # kernels/gdn.py gated_delta_rule_decode: BLOCK_K = next_pow2(Dk), BLOCK_V = min(32, next_pow2(Dv))
    "_gated_delta_rule_decode_kernel": [
        Variant(
            "decode Hv=48 Hk=16 Dk=Dv=128",
            dict(
                q_ptr="bf16",
                k_ptr="bf16",
                v_ptr="bf16",
                a_ptr="bf16",
                b_ptr="bf16",
                a_log_ptr="bf16",
                dt_bias_ptr="bf16",
                states_ptr="fp32",
                slots_ptr="i64",
                out_slots_ptr="i64",
                keep_ptr="i1",
                out_ptr="bf16",
            ),
            dict(
                NUM_V_HEADS=48,
                HEAD_RATIO=3,
                K_DIM=128,
                V_DIM=128,
                BLOCK_K=128,
                BLOCK_V=32,
                USE_QK_L2NORM=True,
            ),
            floats=("scale",),
        ),
    ],
    # kernels/rope.py apply_rope_qk: rotary_dim 64 of 256 -> HALF 32; BLOCK_HQ = next_pow2(24) = 32, BLOCK_HK = 4,
    # BLOCK_T = 2048 // (BLOCK_HQ * BLOCK_HALF) = 2; fp32 cos/sin tables
    "_apply_rope_qk_kernel": [
        Variant(
            "Hq=24 Hk=4 D=256 rotary 64",
            dict(q_ptr="bf16", k_ptr="bf16", cos_ptr="fp32", sin_ptr="fp32"),
            dict(HALF=32, BLOCK_T=2, BLOCK_HQ=32, BLOCK_HK=4, BLOCK_HALF=32),
        ),
    ],
    # kernels/attention/store.py store_kv: BLOCK_D = next_pow2(head_dim); the float cache's scale pointers are the
    # caches themselves (placeholders) and its group constexprs are one group of HEAD_DIM
    "_store_kv_kernel": [
        Variant(
            "Hkv=4 D=256 bf16 cache",
            {
                **_STORE_KV_PTRS,
                "key_cache_ptr": "bf16",
                "value_cache_ptr": "bf16",
                "key_scale_ptr": "bf16",
                "value_scale_ptr": "bf16",
            },
            dict(
                HEAD_DIM=256,
                KV_INT8=False,
                SCALE_GROUP=256,
                NUM_SCALES=1,
                BLOCK_SCALES=1,
                BLOCK_GROUP=256,
                BLOCK_D=256,
            ),
        ),
        Variant(
            "Hkv=4 D=256 int8 cache g64",
            {
                **_STORE_KV_PTRS,
                "key_cache_ptr": "i8",
                "value_cache_ptr": "i8",
                "key_scale_ptr": "fp16",
                "value_scale_ptr": "fp16",
            },
            dict(
                HEAD_DIM=256,
                KV_INT8=True,
                SCALE_GROUP=64,
                NUM_SCALES=4,
                BLOCK_SCALES=4,
                BLOCK_GROUP=64,
                BLOCK_D=256,
            ),
        ),
    ],
    # kernels/attention/decode.py paged_attention_decode: BLOCK_N = 32 for head_dim > 128, BLOCK_G = max(16, group)
    "_paged_attention_decode_kernel": [
        Variant(
            "Hq=24 Hkv=4 D=256 page 64 bf16",
            {
                **_DECODE_PTRS,
                "key_cache_ptr": "bf16",
                "value_cache_ptr": "bf16",
                "key_scale_ptr": "bf16",
                "value_scale_ptr": "bf16",
            },
            dict(_DECODE_27B, KV_INT8=False, INT8_F16=False, NUM_SCALES=1, BLOCK_SCALES=1),
            floats=("scale_log2",),
            aligned=_DECODE_ALIGNED,
        ),
        *(
            Variant(
                f"Hq=24 Hkv=4 D=256 page 64 int8 g64 {'fp16' if f16 else 'fp32'} dequant",
                {
                    **_DECODE_PTRS,
                    "key_cache_ptr": "i8",
                    "value_cache_ptr": "i8",
                    "key_scale_ptr": "fp16",
                    "value_scale_ptr": "fp16",
                },
                dict(
                    _DECODE_27B,
                    KV_INT8=True,
                    INT8_F16=f16,
                    NUM_SCALES=4,
                    BLOCK_SCALES=4,
                    BLOCK_N=64,
                    SPLIT_UNIT=64,
                ),  # fmt: skip
                floats=("scale_log2",),
                aligned=_DECODE_ALIGNED,
            )
            for f16 in (True, False)
        ),
    ],
    # kernels/attention/decode_int8.py (paged_attention_decode's int8_grouped): 64-key tiles, 4 groups of 64
    "_paged_attention_decode_int8_kernel": [
        Variant(
            "Hq=24 Hkv=4 D=256 page 64 int8 g64 grouped dots",
            _DECODE_INT8_PTRS,
            _DECODE_INT8_27B,
            floats=("scale_log2",),
            aligned=_DECODE_ALIGNED,
        ),
    ],
    # decode_int8.py's keys-major build (NINFER_INT8_ATTENTION=keys_major): BLOCK_G = 8 (GQA 6 -> the MMAs' N), the
    # launcher's 128-register cap and 2 stages (INT8_KEYS_MAJOR_LAUNCH); the same tiles as the grouped kernel. (BLOCK_G 16
    # would make Triton pick wgmma on sm_90: 1329 loop instructions, spills at 128 registers; N = 8 stays mma.sync)
    "_paged_attention_decode_int8_km_kernel": [
        Variant(
            "Hq=24 Hkv=4 D=256 page 64 int8 g64 keys-major",
            _DECODE_INT8_PTRS,
            dict(_DECODE_INT8_27B, BLOCK_G=8),
            floats=("scale_log2",),
            aligned=_DECODE_ALIGNED,
            num_stages=2,
            maxnreg=128,
        ),
    ],
    # reduce: BLOCK_S = next_pow2(max_splits), BLOCK_D = min(64, next_pow2(head_dim)); HAS_GATE (NINFER_ATTN_FUSE=on):
    # attention's output gate in the epilogue, read from the fused projection row (14,336 elements; 512 a head)
    "_paged_attention_reduce_kernel": [
        Variant(
            f"Hq=24 D=256 {_ATTN_SPLITS} splits{' gated' if gated else ''}",
            dict(
                part_out_ptr="fp32", part_lse_ptr="fp32", seq_lens_ptr="i32", gate_ptr="bf16", out_ptr="bf16"
            ),
            dict(
                NUM_Q_HEADS=24,
                HEAD_DIM=256,
                SPLIT_UNIT=32,
                MAX_SPLITS=_ATTN_SPLITS,
                BLOCK_S=_ATTN_SPLITS,
                BLOCK_D=64,
                HAS_GATE=gated,
            ),
            aligned=("gate_stride_b", "gate_stride_h", "out_stride_b", "out_stride_h") if gated else (),
        )
        for gated in (False, True)
    ],
    # kernels/attention/fuse.py qk_norm_rope_store (NINFER_ATTN_FUSE=on): _launch_rms_norm's tile (BLOCK_ROWS 8 of
    # BLOCK_D 256), rotary 64 -> HALF 32; q/k/v views of the fused projection row (strides 14,336 / 512 / 256),
    # fp32 cos/sin rows of 64, bf16 norm weights, the bf16 cache's slot / head strides 1,024 / 256
    "_qk_norm_rope_store_kernel": [
        Variant(
            "Hq=24 Hkv=4 D=256 rotary 64 bf16 cache",
            {
                **{p: "bf16" for p in ("q_ptr", "k_ptr", "v_ptr", "q_w_ptr", "k_w_ptr", "q_out_ptr")},
                **{"cos_ptr": "fp32", "sin_ptr": "fp32", "slot_mapping_ptr": "i64"},
                **{"key_cache_ptr": "bf16", "value_cache_ptr": "bf16"},
            },
            dict(HALF=32, BLOCK_ROWS=8, BLOCK_D=256, BLOCK_HALF=32),
            floats=("eps",),
            aligned=_FUSE_ALIGNED,
        ),
    ],
    # kernels/attention/prefill.py paged_prefill_attention (prefill_tiles): GROUP = 24 / 4, BLOCK_D = 256; on sm_90 bf16
    # 128 rows x 64 keys, 8 warps, 2 stages, int8 128 x 32, 3 stages; on other GPUs (sm_120) 64 x 32, 4 warps
    "_paged_prefill_attention_kernel": [
        Variant(
            f"Hq=24 Hkv=4 D=256 page 64 {kv} {m}x{n} w{warps} s{stages}",
            {
                **_PREFILL_PTRS,
                "key_cache_ptr": "i8" if kv == "int8" else "bf16",
                "value_cache_ptr": "i8" if kv == "int8" else "bf16",
                "key_scale_ptr": "fp16" if kv == "int8" else "bf16",
                "value_scale_ptr": "fp16" if kv == "int8" else "bf16",
            },
            dict(
                _PREFILL_27B,
                KV_INT8=kv == "int8",
                NUM_SCALES=4 if kv == "int8" else 1,
                BLOCK_SCALES=4 if kv == "int8" else 1,
                BLOCK_M=m,
                BLOCK_N=n,
            ),
            floats=("scale_log2",),
            num_warps=warps,
            num_stages=stages,
        )
        for kv, m, n, warps, stages in (
            ("bf16", 128, 64, 8, 2),
            ("int8", 128, 32, 8, 3),
            ("bf16", 64, 32, 4, 2),
            ("int8", 64, 32, 4, 2),
        )
    ],
    # kernels/moe.py at the Qwen3.6-35B-A3B geometry (the MoE model): E=256 experts, top_k 8, H 2048, I 512,
    # bf16 router logits and expert weights, fp32 routing weights and act, int64 expert ids.
    # moe_route: BLOCK_E = next_pow2(E), BLOCK_TOPK = next_pow2(top_k), BLOCK_T = ROUTE_BLOCK_T 8 tokens a program
    "_moe_route_kernel": [
        Variant(
            "E=256 top_k=8",
            dict(logits_ptr="bf16", weights_ptr="fp32", ids_ptr="i64"),
            dict(TOP_K=8, BLOCK_TOPK=8, BLOCK_T=8, BLOCK_E=256, RENORMALIZE=True),
        ),
    ],
    # kernels/moe_router.py moe_router (the router GEMV + routing in one launch): gemv_tiles(256, 2048, bf16) = 32
    # rows x 256 columns, 4 warps, 4 stages, K split in 8; BLOCK_T = ROUTE_BLOCK_T 8, BLOCK_E 256, BLOCK_TOPK 8
    "_moe_router_kernel": [
        Variant(
            "35B-A3B router 256x2048 split 8 top_k=8",
            dict(
                x_ptr="bf16",
                w_ptr="bf16",
                part_ptr="fp32",
                count_ptr="i32",
                weights_ptr="fp32",
                ids_ptr="i64",
            ),
            dict(
                NUM_EXPERTS=256,
                K_SPLIT=256,
                SPLIT_K=8,
                TOP_K=8,
                BLOCK_TOPK=8,
                BLOCK_T=8,
                BLOCK_E=256,
                BLOCK_N=32,
                BLOCK_K=256,
                NUM_STAGES=4,
                RENORMALIZE=True,
                IEEE=False,
            ),
            aligned=("x_stride",),
            num_stages=4,
        ),
    ],
    # moe_experts (moe_tiles for bf16): BLOCK_N = 4, BLOCK_K = 2048, 8 warps; BLOCK_H = 4, BLOCK_I = 256, 4 warps;
    # routed experts only (SHARED_INTER 0) and with the shared expert (the model's path: I_s = 512)
    "_moe_gate_up_kernel": [
        Variant(
            f"H=2048 I=512 top_k=8{f' + shared I_s={shared}' if shared else ''}"
            f"{' pairs sorted (T > 32)' if sort else ''}",
            dict(
                x_ptr="bf16",
                gate_up_ptr="bf16",
                ids_ptr="i64",
                weights_ptr="fp32",
                order_ptr="i64",
                shared_gate_ptr="bf16",
                shared_up_ptr="bf16",
                shared_score_ptr="bf16",
                act_ptr="fp32",
            ),
            dict(HIDDEN=2048, INTER=512, TOP_K=8, SHARED_INTER=shared, SORTED=sort, BLOCK_N=4, BLOCK_K=2048),
            num_warps=8,
        )
        for shared in (0, 512)
        for sort in (False, True)
    ],
    "_moe_down_kernel": [
        Variant(
            f"H=2048 I=512 top_k=8{f' + shared I_s={shared}' if shared else ''}",
            dict(act_ptr="fp32", down_ptr="bf16", ids_ptr="i64", shared_down_ptr="bf16", out_ptr="bf16"),
            dict(HIDDEN=2048, INTER=512, TOP_K=8, SHARED_INTER=shared, BLOCK_TOPK=8, BLOCK_H=4, BLOCK_I=256),
            num_warps=4,
        )
        for shared in (0, 512)
    ],
    # moe_combine (the prefill combine): H 2048, top_k 8 -> BLOCK_TOPK 8, BLOCK_H 1024, 4 warps; bf16 expert
    # outputs, shared output and out, int64 rows, fp32 routing weights; without and with the shared term
    "_moe_combine_kernel": [
        Variant(
            f"H=2048 top_k=8{' + shared' if has_shared else ''}",
            dict(
                expert_out_ptr="bf16", rows_ptr="i64", weights_ptr="fp32", shared_ptr="bf16", out_ptr="bf16"
            ),
            dict(HIDDEN=2048, TOP_K=8, HAS_SHARED=has_shared, BLOCK_TOPK=8, BLOCK_H=1024),
        )
        for has_shared in (False, True)
    ],
    # kernels/bitmask.py apply_token_bitmask_: fp32 logits of the sampler, int32 llguidance bitmask words, BLOCK 4096
    "_apply_token_bitmask_kernel": [
        Variant("V=248320 fp32", dict(logits_ptr="fp32", bitmask_ptr="i32"), dict(BLOCK=4096)),
    ],
    # kernels/state_copy.py copy_state_slots (NINFER_ROLLBACK_COPY=skip): BLOCK 4096, 4 warps; the 27B's fp32
    # recurrent stack (48 x 128 x 128 a slot) and bf16 conv stack (10240 x 3 a slot), int64 slot ids; slot and layer
    # strides are multiples of 16 there
    "_copy_state_slots_kernel": [
        Variant(
            f"27B {label}",
            dict(stack_ptr=dtype, src_ptr="i64", dst_ptr="i64"),
            dict(BLOCK=4096),
            aligned=("layer_stride", "slot_stride", "numel"),
        )
        for label, dtype in (("recurrent fp32", "fp32"), ("conv bf16", "bf16"))
    ],
}
