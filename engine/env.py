"""Every environment variable NInfer reads: one prefix (`NINFER_`), typed, parsed in one place.

The kernel switches are parsed by `kernels/_dispatch.py` (kernels import nothing of ours, so they cannot read
them here); the functions below report what it parsed, so there is one reading and one set of rules.
Two more are read where they are used: `NINFER_API_KEY` (the server's API key when neither `--api-key` nor
`--api-key-file` is given; api/serve.py) and `NINFER_COMMIT` (the commit `ninfer-bench` records in its results
when `git rev-parse HEAD` would be wrong or fail, as on the device machine; engine/testing/bench/cli.py).
"""

from __future__ import annotations

import os
from pathlib import Path

from platformdirs import user_cache_dir


def cache_dir() -> Path:
    """`NINFER_CACHE_DIR`: where built files (demo model, converted tokenizer) are cached."""
    return Path(os.environ.get("NINFER_CACHE_DIR") or user_cache_dir("ninfer"))


def moe_experts_mode() -> str:
    """`NINFER_MOE_EXPERTS`: how a groupwise-int MoE artifact's routed experts are loaded: `quantized` (the default:
    they stay in their stored bytes, decode streams them, prefill dequantizes one layer at a time into one shared
    scratch; engine/model/quant_experts.py) or `dequantized` (dense bf16 banks built once at load: about 3x the
    memory). Read when a model is loaded; ValueError for anything else."""
    value = os.environ.get("NINFER_MOE_EXPERTS", "quantized")
    mode = value.strip().lower()
    if mode not in ("quantized", "dequantized"):
        raise ValueError(f"NINFER_MOE_EXPERTS={value!r}: expected 'quantized', 'dequantized'")
    return mode


def kernels_mode() -> str:
    """`NINFER_KERNELS`: `auto` (Triton on CUDA, torch references elsewhere; `triton` is the same) or `ref`
    (references always). Read once when `kernels` is imported (`kernels._dispatch.KERNELS_MODE`)."""
    from kernels import _dispatch

    return _dispatch.KERNELS_MODE


def attn_fuse_mode() -> str:
    """`NINFER_ATTN_FUSE`: `off` (the default: gated attention's q/k norms, RoPE and K/V store are four launches, the
    decode output gate one more) or `on` (norms, RoPE and a float cache's store in one launch, the output gate in the
    decode reduce; bitwise the same outputs). Read once when `kernels` is imported (`kernels._dispatch.ATTN_FUSE`)."""
    from kernels import _dispatch

    return _dispatch.ATTN_FUSE


def gemv_mode() -> str:
    """`NINFER_GEMV`: `auto` (the default: decode-sized linear layers, at most 8 rows, run the Triton GEMV on CUDA
    on the weight shapes where it was measured faster than cuBLAS, `kernels.linear.GEMV_FASTER`), `off`
    (`F.linear`, cuBLAS, always) or `on` (the GEMV for every such layer).
    Read once when `kernels` is imported (`kernels._dispatch.GEMV_MODE`)."""
    from kernels import _dispatch

    return _dispatch.GEMV_MODE


def quant_gemv_mode() -> str:
    """`NINFER_QUANT_GEMV`: `packed` (the default: planes reordered once at load for the GEMV-layout kernels) or
    `stored` (the groupwise decode GEMV reads the file's byte order).
    Read once when `kernels` is imported (`kernels._dispatch.QUANT_GEMV_MODE`)."""
    from kernels import _dispatch

    return _dispatch.QUANT_GEMV_MODE


def moe_router_mode() -> str:
    """`NINFER_MOE_ROUTER`: `split` (the default: a MoE block's router linear, then the routing kernel) or `fused`
    (decode-sized batches on CUDA: the router GEMV and the routing in one launch, `kernels.moe_router`).
    Read once when `kernels` is imported (`kernels._dispatch.MOE_ROUTER_MODE`)."""
    from kernels import _dispatch

    return _dispatch.MOE_ROUTER_MODE


def splitk_reduce_mode() -> str:
    """`NINFER_SPLITK_REDUCE`: `launch` (the default: a split-K GEMV's partials summed by one more launch) or `last`
    (the last split of each row tile sums them, no reduce launch; bitwise the same outputs).
    Read once when `kernels` is imported (`kernels._dispatch.SPLITK_REDUCE`)."""
    from kernels import _dispatch

    return _dispatch.SPLITK_REDUCE


def quant_moe_mode() -> str:
    """`NINFER_QUANT_MOE`: `v1` (the default) or `v2`: which decode kernels the groupwise-int routed experts run
    (`kernels.quant.quant_moe`; v2 has ~8x the programs a token, pending an H200 measurement).
    Read once when `kernels` is imported (`kernels._dispatch.QUANT_MOE_MODE`)."""
    from kernels import _dispatch

    return _dispatch.QUANT_MOE_MODE


def quant_moe_shared_mode() -> str:
    """`NINFER_QUANT_MOE_SHARED`: `fused` (the default: a quantized MoE layer's decode adds the shared expert, gated,
    inside its expert kernels) or `separate` (the gate, product and add as launches of their own).
    Read once when `kernels` is imported (`kernels._dispatch.QUANT_MOE_SHARED`)."""
    from kernels import _dispatch

    return _dispatch.QUANT_MOE_SHARED


def moe_prefill_mode() -> str:
    """`NINFER_MOE_PREFILL`: `scratch` (the default: a quantized MoE layer's prefill dequantizes its banks into a
    shared bf16 scratch for the dense grouped GEMMs) or `quant` (a grouped GEMM on the quantized banks, weight tiles
    dequantized in registers, `kernels.quant.quant_moe_grouped`; pending an H200 measurement).
    Read once when `kernels` is imported (`kernels._dispatch.MOE_PREFILL`)."""
    from kernels import _dispatch

    return _dispatch.MOE_PREFILL


def int8_attention_mode() -> str:
    """`NINFER_INT8_ATTENTION`: `grouped` (the default) or `keys_major`: which build of the grouped INT8 decode
    attention (int8 KV, 16-bit queries) runs; `keys_major` puts the keys on the MMAs' rows (half the MMAs, 128
    registers). Read once when `kernels` is imported (`kernels._dispatch.INT8_ATTENTION`)."""
    from kernels import _dispatch

    return _dispatch.INT8_ATTENTION


def pdl_mode() -> str:
    """`NINFER_PDL`: `off` (the default until an H200 measurement) or `on`: the decode step's Triton kernels launch
    with Programmatic Dependent Launch on sm_90+ GPUs (`kernels.pdl`: a kernel starts while its predecessor
    finishes, prefetches its weights, then waits). Read once when `kernels` is imported (`kernels._dispatch.PDL_MODE`)."""
    from kernels import _dispatch

    return _dispatch.PDL_MODE


def fp_one_row_mode() -> str:
    """`NINFER_FP_ONE_ROW`: `rows` (the default) or `ring`: the one-row decode GEMV of NVFP4 and FP8 rows prefetches
    the next step's words in registers (`rows`) or streams the weight bytes through a cp.async ring of shared-memory
    slots (`ring`). Read once when `kernels` is imported (`kernels._dispatch.FP_ONE_ROW`)."""
    from kernels import _dispatch

    return _dispatch.FP_ONE_ROW


def rollback_copy_mode() -> str:
    """`NINFER_ROLLBACK_COPY`: `gather` (the default until an H200 measurement) or `skip`: how a speculative round's
    rollback copies GDN state slots on the GPU (`kernels.state_copy`: `skip` is one Triton copy that moves nothing for
    a row that kept all its drafts). Read once when `kernels` is imported (`kernels._dispatch.ROLLBACK_COPY`)."""
    from kernels import _dispatch

    return _dispatch.ROLLBACK_COPY


def gemv_variants() -> dict[str, str | None]:
    """`NINFER_ONE_ROW`, `NINFER_FEW_ROWS`, `NINFER_W8_ONE_ROW`: a `kernels.quant.packed_linear.GEMV_VARIANTS` name
    every groupwise-int decode GEMV of one row (Q4/Q5/Q6), of 2..8 rows (Q4/Q5/Q6), of one W8 row takes instead of
    the measured tables (for measuring a variant end to end); unset: the tables. Read once when `kernels` is
    imported (`kernels._dispatch`)."""
    from kernels import _dispatch

    return {
        "NINFER_ONE_ROW": _dispatch.ONE_ROW_VARIANT,
        "NINFER_FEW_ROWS": _dispatch.FEW_ROWS_VARIANT,
        "NINFER_W8_ONE_ROW": _dispatch.W8_ONE_ROW_VARIANT,
    }


DFLASH_GRAPH_CONTEXT = 8192  # the default below


def dflash_graph_context() -> int:
    """`NINFER_DFLASH_GRAPH_CONTEXT`: the longest context (tokens) whose DFlash drafter rounds replay a CUDA graph
    (engine/spec/dflash_graphs.py captures one per batch size and power-of-two context bucket up to it; its full
    layer gathers the whole context, so this bounds the graphs' memory); longer contexts run the same round
    eagerly. Default 8192; 0 captures none. Read when the graphs are built; ValueError for a non-integer or a
    negative value."""
    value = os.environ.get("NINFER_DFLASH_GRAPH_CONTEXT", "").strip()
    if not value:
        return DFLASH_GRAPH_CONTEXT
    try:
        tokens = int(value)
    except ValueError:
        tokens = -1
    if tokens < 0:
        raise ValueError(f"NINFER_DFLASH_GRAPH_CONTEXT={value!r}: expected a token count >= 0")
    return tokens


def spec_one_wait_sampled() -> bool:
    """`NINFER_SPEC_ONE_WAIT_SAMPLED`: `on` (the default: speculative rounds of sampled or penalized rows that fit the
    static buffers wait for the host once, rejection sampling on the device, engine/runner/spec_sampled.py) or `off`
    (they take the general round, which waits for the verdict and then for the drafts). Read when a speculative
    runner is built; ValueError for anything else."""
    value = os.environ.get("NINFER_SPEC_ONE_WAIT_SAMPLED", "on")
    mode = value.strip().lower()
    if mode not in ("on", "off"):
        raise ValueError(f"NINFER_SPEC_ONE_WAIT_SAMPLED={value!r}: expected 'on', 'off'")
    return mode == "on"
