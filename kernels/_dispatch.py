"""Which implementation a kernel launcher runs: its Triton kernel, or its torch reference.

A launcher runs Triton only when Triton imports, every tensor it is given lives on a CUDA device, and
``NINFER_KERNELS`` is not ``ref`` (``ref`` forces the references everywhere: debugging, bisecting a
kernel, CPU CI). With ``TRITON_INTERPRET=1`` Triton's interpreter runs the kernels on CPU tensors too,
which is how the kernels are checked on a machine without a GPU.

``NINFER_GEMV`` picks what the bias-free linear layers of few rows run (``kernels.linear.linear``): ``auto`` (the
default: the Triton GEMV for at most 8 rows on the weight shapes where it was measured faster than cuBLAS on that
GPU, ``kernels.linear.GEMV_FASTER``, end to end 35B-A3B decode 3.01 ms a step against 3.10 on the H200;
``F.linear`` for everything else), ``off`` (``F.linear``, i.e. cuBLAS on CUDA, always) or ``on`` (the Triton GEMV
for every linear of at most 8 rows wherever the kernels run Triton).

``NINFER_ONE_ROW``, ``NINFER_FEW_ROWS``, ``NINFER_W8_ONE_ROW`` force one of ``kernels.quant.packed_linear``'s GEMV
variants for the groupwise-int decode GEMV of one row, of 2..8 rows, of one W8 row (for measuring a variant end to
end; unset: the measured tables; an unknown name is refused when that module is imported).

``NINFER_FP_ONE_ROW`` picks the one-row decode GEMV of NVFP4 and FP8 rows (``kernels.quant.quant_linear``): ``rows``
(the default: ``gluon_gemv``'s ``_quant_gemv_nvfp4_rows_kernel`` / ``_quant_gemv_fp8_rows_kernel``, the next step's
words prefetched in registers) or ``ring`` (the same arithmetic, the weight bytes streamed through a cp.async ring of
shared-memory slots, ``_quant_gemv_nvfp4_ring_kernel`` / ``_quant_gemv_fp8_ring_kernel``). Waits for an H200
measurement before it becomes the default.

``NINFER_ATTN_FUSE`` picks how gated attention runs where the kernels run Triton: ``off`` (the default: the q and k
norms, the RoPE and the K/V store are four launches, the output gate one more after the decode reduce) or ``on``
(``kernels.attention.fuse.qk_norm_rope_store``: norms, RoPE and a float cache's store in one launch; decode's
output gate folded into the split-K reduce, ``paged_attention_decode(gate=...)``): a bf16-KV decode layer runs 3
launches between its projections and ``o_proj`` instead of 7, bitwise the same outputs. Waits for an H200
measurement before it becomes the default.

``NINFER_QUANT_GEMV`` picks the layout the row-split (groupwise-int) decode GEMV reads on a GPU: ``packed`` (the
default: the planes reordered once at load, ``kernels.quant.repack``, for ``kernels.quant.gluon_gemv`` (one row)
and ``kernels.quant.triton_gemv``; 2.2x the stored layout's decode on the H200) or ``stored`` (the file's byte
order, ``kernels.quant.triton_group``).

``NINFER_MOE_ROUTER`` picks how a MoE block routes decode-sized batches (1..8 rows) where the kernels run Triton:
``split`` (the default: the router linear, ``kernels.linear.linear``, then ``kernels.moe.moe_route``: two or three
launches) or ``fused`` (``kernels.moe_router.moe_router``: the router GEMV and the routing in one launch; bitwise
``split`` under ``NINFER_GEMV=on``).

``NINFER_SPLITK_REDUCE`` picks how the Triton GEMV (``kernels.linear``) and the quantized ring GEMVs
(``kernels.quant.gluon_gemv``'s ``_ring_store``) sum a split K's fp32 partials: ``launch``
(the default: ``_linear_reduce_kernel``, one more launch) or ``last`` (the last split of each row tile to finish
sums them in the same order: no reduce launch, bitwise the same outputs).

``NINFER_QUANT_MOE`` picks the decode kernels of the groupwise-int routed experts (``kernels.quant.quant_moe``):
``v1`` (the default: ``triton_group.py``'s two kernels, a grid of 128 down programs a token) or ``v2``
(``kernels.quant.triton_moe``: ~8x the programs a token, whole-chunk tiles whose loads are all issued before the
arithmetic); both batch invariant, neither bitwise the other (they sum in different orders). ``v2`` waits for an
H200 measurement (``bench/kernels/quant.py --moe-only``) before it becomes the default.

``NINFER_QUANT_MOE_SHARED`` picks where a quantized MoE layer's decode (``engine/model/quant_experts.py``) adds the
shared expert: ``fused`` (the default: its sigmoid gate computed by the gate_up kernel, its gated output added by
the down kernel before the one rounding, ``quant_moe_experts(..., shared, shared_gate)``: no launch of its own) or
``separate`` (session 11's: the gate GEMV, sigmoid and product by the block, the add by one more launch; the A/B
for the H200 measurement, and a way back).

``NINFER_MOE_PREFILL`` picks how a quantized MoE layer (``engine/model/quant_experts.py``) runs more than
``QUANT_MAX_TOKENS`` tokens (prefill chunks): ``scratch`` (the default: both banks dequantized to a shared bf16
scratch, then the dense grouped GEMMs) or ``quant`` (``kernels.quant.quant_moe_grouped``: a grouped GEMM that
dequantizes weight tiles in registers, no dense copy of the banks, no scratch allocated). ``quant`` waits for an H200 measurement
(``scripts/device/plans/2026-12-05-s13-qgroup.txt``) before it becomes the default.

``NINFER_INT8_ATTENTION`` picks the build of the grouped INT8 decode attention (int8 KV with 16-bit queries,
``kernels.attention.decode_int8``): ``grouped`` (the default: query heads as the MMAs' rows, [heads, keys] scores) or
``keys_major`` (keys as the MMAs' rows, the few query heads of a KV head as their columns: half the MMAs, capped at
128 registers, 2 stages; sm_90 loop 863 instructions a 64-key tile against 1231, waiting for an H200 measurement).

``NINFER_PDL`` turns on Programmatic Dependent Launch for the decode step's Triton kernels on sm_90+ GPUs
(``kernels.pdl``: a kernel may launch while its predecessor finishes and prefetch its weights before it waits):
``off`` (the default until an H200 measurement) or ``on``. Always off under Triton's interpreter.

``NINFER_ROLLBACK_COPY`` picks how a speculative rollback copies GDN state slots where the kernels run Triton
(``kernels.state_copy.copy_state_slots``): ``gather`` (the default: a gather and a scatter of every row, a row that
kept all its drafts copying its own slot onto itself) or ``skip`` (the Triton copy: one read and one write a row,
nothing for a row whose source is its own slot). Waits for an H200 measurement before it becomes the default.

``kernels`` may not import ``engine``, so this is the one place that reads these variables, once, at
import; ``engine/env.py`` (every variable NInfer reads) reports the values parsed here.
"""

from __future__ import annotations

import os

import torch

try:  # NOTE: Triton is an optional (GPU) dependency; the references never need it.
    import triton  # noqa: F401

    HAS_TRITON = True
except ImportError:
    HAS_TRITON = False

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"


def _parse(name: str, value: str, allowed: tuple[str, ...]) -> str:
    mode = value.strip().lower()
    if mode not in allowed:
        raise ValueError(f"{name}={value!r}: expected {', '.join(repr(a) for a in allowed)}")
    return mode


def parse_kernels_mode(value: str) -> str:
    """``NINFER_KERNELS``'s value, normalised: ``auto`` (``triton`` is the same), or ``ref``."""
    return _parse("NINFER_KERNELS", value, ("auto", "ref", "triton"))


def parse_attn_fuse_mode(value: str) -> str:
    """``NINFER_ATTN_FUSE``'s value, normalised: ``off`` or ``on``; ValueError for anything else."""
    return _parse("NINFER_ATTN_FUSE", value, ("off", "on"))


def parse_gemv_mode(value: str) -> str:
    """``NINFER_GEMV``'s value, normalised: ``auto``, ``on`` or ``off``; ValueError for anything else."""
    return _parse("NINFER_GEMV", value, ("auto", "on", "off"))


def parse_quant_gemv_mode(value: str) -> str:
    """``NINFER_QUANT_GEMV``'s value, normalised: ``stored`` or ``packed``; ValueError for anything else."""
    return _parse("NINFER_QUANT_GEMV", value, ("stored", "packed"))


def parse_moe_router_mode(value: str) -> str:
    """``NINFER_MOE_ROUTER``'s value, normalised: ``split`` or ``fused``; ValueError for anything else."""
    return _parse("NINFER_MOE_ROUTER", value, ("split", "fused"))


def parse_splitk_reduce_mode(value: str) -> str:
    """``NINFER_SPLITK_REDUCE``'s value, normalised: ``launch`` or ``last``; ValueError for anything else."""
    return _parse("NINFER_SPLITK_REDUCE", value, ("launch", "last"))


def parse_quant_moe_mode(value: str) -> str:
    """``NINFER_QUANT_MOE``'s value, normalised: ``v1`` or ``v2``; ValueError for anything else."""
    return _parse("NINFER_QUANT_MOE", value, ("v1", "v2"))


def parse_quant_moe_shared_mode(value: str) -> str:
    """``NINFER_QUANT_MOE_SHARED``'s value, normalised: ``fused`` or ``separate``; ValueError for anything else."""
    return _parse("NINFER_QUANT_MOE_SHARED", value, ("fused", "separate"))


def parse_moe_prefill_mode(value: str) -> str:
    """``NINFER_MOE_PREFILL``'s value, normalised: ``scratch`` or ``quant``; ValueError for anything else."""
    return _parse("NINFER_MOE_PREFILL", value, ("scratch", "quant"))


def parse_int8_attention_mode(value: str) -> str:
    """``NINFER_INT8_ATTENTION``'s value, normalised: ``grouped`` or ``keys_major``; ValueError for anything else."""
    return _parse("NINFER_INT8_ATTENTION", value, ("grouped", "keys_major"))


def parse_fp_one_row_mode(value: str) -> str:
    """``NINFER_FP_ONE_ROW``'s value, normalised: ``rows`` or ``ring``; ValueError for anything else."""
    return _parse("NINFER_FP_ONE_ROW", value, ("rows", "ring"))


def parse_pdl_mode(value: str) -> str:
    """``NINFER_PDL``'s value, normalised: ``off`` or ``on``; ValueError for anything else."""
    return _parse("NINFER_PDL", value, ("off", "on"))


def parse_rollback_copy_mode(value: str) -> str:
    """``NINFER_ROLLBACK_COPY``'s value, normalised: ``gather`` or ``skip``; ValueError for anything else."""
    return _parse("NINFER_ROLLBACK_COPY", value, ("gather", "skip"))


def parse_gemv_variant(value: str | None) -> str | None:
    """A forced GEMV-layout tile variant (``NINFER_ONE_ROW``, ``NINFER_FEW_ROWS``, ``NINFER_W8_ONE_ROW``): None
    when unset or empty, else the name (``kernels.quant.packed_linear`` checks it against its variants)."""
    return (value or "").strip() or None


KERNELS_MODE = parse_kernels_mode(os.environ.get("NINFER_KERNELS", "auto"))
ATTN_FUSE = parse_attn_fuse_mode(os.environ.get("NINFER_ATTN_FUSE", "off"))
# forced tile variants of the groupwise-int decode GEMV, for measuring one (unset: the measured tables)
ONE_ROW_VARIANT = parse_gemv_variant(os.environ.get("NINFER_ONE_ROW"))
FEW_ROWS_VARIANT = parse_gemv_variant(os.environ.get("NINFER_FEW_ROWS"))
W8_ONE_ROW_VARIANT = parse_gemv_variant(os.environ.get("NINFER_W8_ONE_ROW"))
GEMV_MODE = parse_gemv_mode(os.environ.get("NINFER_GEMV", "auto"))
QUANT_GEMV_MODE = parse_quant_gemv_mode(os.environ.get("NINFER_QUANT_GEMV", "packed"))
MOE_ROUTER_MODE = parse_moe_router_mode(os.environ.get("NINFER_MOE_ROUTER", "split"))
SPLITK_REDUCE = parse_splitk_reduce_mode(os.environ.get("NINFER_SPLITK_REDUCE", "launch"))
QUANT_MOE_MODE = parse_quant_moe_mode(os.environ.get("NINFER_QUANT_MOE", "v1"))
QUANT_MOE_SHARED = parse_quant_moe_shared_mode(os.environ.get("NINFER_QUANT_MOE_SHARED", "fused"))
MOE_PREFILL = parse_moe_prefill_mode(os.environ.get("NINFER_MOE_PREFILL", "scratch"))
INT8_ATTENTION = parse_int8_attention_mode(os.environ.get("NINFER_INT8_ATTENTION", "grouped"))
PDL_MODE = parse_pdl_mode(os.environ.get("NINFER_PDL", "off"))
FP_ONE_ROW = parse_fp_one_row_mode(os.environ.get("NINFER_FP_ONE_ROW", "rows"))
ROLLBACK_COPY = parse_rollback_copy_mode(os.environ.get("NINFER_ROLLBACK_COPY", "gather"))


def use_triton(*tensors: torch.Tensor | None) -> bool:
    """True when the Triton kernel should run on these tensors (None entries are ignored).

    Every launcher asks this once a call (~12 times a decode layer, on the host's launch path), so it is a plain
    loop: no list, no generator."""
    if not HAS_TRITON or KERNELS_MODE == "ref":
        return False
    if INTERPRET:
        return True
    for t in tensors:
        if t is not None and not t.is_cuda:
            return False
    return True
