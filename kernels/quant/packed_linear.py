"""Launchers of the GEMV-layout kernels (``triton_gemv.py``): the decode GEMV of a row-split weight that
``view_planes(..., repack=True)`` rewrote (``QuantWeight.gemv_layout``), its launch tiles, and the dequantize
of that layout for the prefill route. ``quant_linear`` calls these; the reference stays ``quant_linear_ref``.

Tiles (``packed_tiles``) depend on the format and the weight's shape only (never on T: batch invariance), from
``GEMV_VARIANTS`` by name: ``GEMV_TABLE`` maps a (format, N, K) measured on the H200 to its best variant,
everything else takes ``"default"``. No autotuning on the decode path. The bench (``bench/kernels/quant.py
--variants``) times every variant side by side so the table can be filled from one run.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from kernels import _dispatch
from kernels._dispatch import HAS_TRITON, INTERPRET
from kernels.pdl import pdl_args
from kernels.quant.formats import GROUP_FORMATS
from kernels.quant.repack import UNIT
from kernels.quant.weight import QuantWeight

if HAS_TRITON:
    import triton

    from kernels.linear import REDUCE_BLOCK, TICKET_COUNTERS, _linear_reduce_kernel, ticket_counters
    from kernels.quant.gluon_gemv import HAS_GLUON
    from kernels.quant.triton_gemv import _quant_dequant_packed_kernel, _quant_gemv_packed_kernel

    if HAS_GLUON:
        from kernels.quant.gluon_gemv import (
            MMA_GROUP_ASM,
            _quant_gemv_mma_kernel,
            _quant_gemv_mma_ring_kernel,
            _quant_gemv_pairs_kernel,
            _quant_gemv_ring_kernel,
            _quant_gemv_w8_pairs_kernel,
            _quant_gemv_w8_ring_kernel,
        )

# the Triton kernel's MODE: tensor cores (T <= 8), CUDA cores (T = 1 only). The "pairs" tiles (T = 1, bf16 x,
# Q4/Q5/Q6, K a multiple of 128) run the Gluon kernel (gluon_gemv.py); under the interpreter, which has no
# Gluon, they run the "fma" mode.
MODES = {"dot": 0, "fma": 1}


class PackedTiles(NamedTuple):
    """Launch shape of the GEMV-layout GEMV."""

    block_n: int  # weight rows a program
    step_units: int  # units of 128 lanes a loop step (their loads issued together)
    num_warps: int
    split_k: int  # programs along K (fp32 partials + the reduce kernel when > 1)
    mode: str = "dot"  # "dot" (any T <= 8) or "fma" (T = 1 only)
    num_stages: int = 1  # Triton's software pipelining of the loop (1: only the kernel's register prefetch)


class GemvVariant(NamedTuple):
    block_n: int
    step_units: int
    num_warps: int
    # 0: split K for whole waves (``_wave_split``); else split K until the grid has this many programs
    min_programs: int
    mode: str = "dot"
    num_stages: int = 1


GEMV_VARIANTS: dict[str, GemvVariant] = {
    "default": GemvVariant(128, 1, 4, 0),
    "p512": GemvVariant(128, 1, 4, 512),
    "p1024": GemvVariant(128, 1, 4, 1024),
    "p256": GemvVariant(128, 1, 4, 256),
    "step2": GemvVariant(128, 2, 4, 512),
    "n64": GemvVariant(64, 1, 4, 1024),
    "n128w8": GemvVariant(128, 1, 8, 512),
    "n256w8": GemvVariant(256, 1, 8, 256),
    "nosplit": GemvVariant(128, 1, 4, 1),
    "st3": GemvVariant(128, 1, 4, 0, "dot", 3),
    "fma": GemvVariant(64, 1, 4, 1024, "fma"),
    # the Gluon one-row kernel: rows a thread = block_n / (8 * warps) (4, 2 or 1: fewer registers, more warps an SM;
    # x's words shared by fewer rows), step_units 2: two units of a row in flight a thread
    "pairs": GemvVariant(128, 1, 4, 0, "pairs"),
    "pairs_n64": GemvVariant(64, 1, 4, 0, "pairs"),
    "pairs_n64s2": GemvVariant(64, 2, 4, 0, "pairs"),
    "pairs_n64w2": GemvVariant(64, 1, 2, 0, "pairs"),
    "pairs_n32": GemvVariant(32, 1, 4, 0, "pairs"),
    "pairs_n32w2": GemvVariant(32, 1, 2, 1024, "pairs"),
    "pairs_n32w2s2": GemvVariant(32, 2, 2, 0, "pairs"),
    # the same loads, the products on the tensor cores (gluon_gemv._quant_gemv_mma_kernel: 16 rows a warp, a
    # thread 2 rows x 4 words; block_n a multiple of 16 x warps)
    "mma_n64": GemvVariant(64, 1, 4, 0, "mma"),
    "mma_n64s2": GemvVariant(64, 2, 4, 0, "mma"),
    "mma_n128": GemvVariant(128, 1, 4, 0, "mma"),
    "mma_n128s2": GemvVariant(128, 2, 4, 0, "mma"),
    "mma_n32w2": GemvVariant(32, 1, 2, 0, "mma"),
    "mma_n32w2s2": GemvVariant(32, 2, 2, 0, "mma"),
    "mma_n128w8": GemvVariant(128, 1, 8, 0, "mma"),
    # the pairs kernel's arithmetic, its weight bytes through a cp.async ring of num_stages shared-memory slots
    # (gluon_gemv._quant_gemv_ring_kernel: bytes in flight without registers; step_units units a slot)
    "ring_n64s2": GemvVariant(64, 2, 4, 0, "ring", 4),
    "ring_n64s2st3": GemvVariant(64, 2, 4, 0, "ring", 3),
    "ring_n64s1": GemvVariant(64, 1, 4, 0, "ring", 4),
    "ring_n32w2s2": GemvVariant(32, 2, 2, 0, "ring", 4),
    "ring_n128s1": GemvVariant(128, 1, 4, 0, "ring", 4),
    "ring_n32s2": GemvVariant(32, 2, 4, 0, "ring", 4),  # (W8's: 2 rows a thread)
    # the tensor-core kernel's arithmetic (1..8 rows of x) through the same ring (_quant_gemv_mma_ring_kernel)
    "mmaring_n64s2": GemvVariant(64, 2, 4, 0, "mma_ring", 4),
    "mmaring_n128s1": GemvVariant(128, 1, 4, 0, "mma_ring", 4),
    "mmaring_n32w2s2": GemvVariant(32, 2, 2, 0, "mma_ring", 4),
}
# one row of x (decode at C=1): the Gluon kernel, its tiles per 27B shape as timed on the H200 (2026-12-04,
# bench/results/h200_2026-12-04_session8/kernels_quant_pairs_variants.json), else ONE_ROW_VARIANT
ONE_ROW_VARIANT = "pairs_n64s2"
# 2..8 rows of x (decode at C=2..8, speculative verify): the tensor-core Gluon kernel, its tiles per 27B shape as
# timed on the H200 at T=8 (2026-12-04, bench/results/h200_2026-12-04_session9/kernels_quant_mma_rows.jsonl; 1.2-1.9x
# the Triton tensor-core GEMV), else FEW_ROWS_VARIANT; W8 keeps the Triton GEMV ("default")
FEW_ROWS_VARIANT = "mma_n128s2"
FEW_ROWS_TABLE: dict[tuple[str, int, int], str] = {
    ("Q4G64_F16S", 7168, 5120): "mma_n64s2",  # attention query_key: 13.0 us (n128s2 13.5, Triton dot 19.0)
    ("Q5G64_F16S", 7168, 5120): "mma_n128",  # attention gate_value: 16.3 us (n128s2 16.9, dot 26.8)
    ("Q5G64_F16S", 5120, 6144): "mma_n128",  # attention / GDN output: 14.4 us (n128s2 15.2, dot 21.8)
    ("Q4G64_F16S", 4096, 5120): "mma_n64s2",  # GDN query_key: 9.8 us (n128s2 10.0, dot 13.7)
    ("Q4G64_F16S", 34816, 5120): "mma_n32w2s2",  # MLP gate_up: 44.4 us (n128s2 49.1, dot 86.3)
}
# NINFER_ONE_ROW=NAME / NINFER_FEW_ROWS=NAME: every Q4/Q5/Q6 GEMV of one row / of 2..8 rows takes that variant
# (table included), for measuring one ("mma_*" variants take 1..8 rows)
ONE_ROW_FORCED = _dispatch.ONE_ROW_VARIANT
FEW_ROWS_FORCED = _dispatch.FEW_ROWS_VARIANT
for _forced in (ONE_ROW_FORCED, FEW_ROWS_FORCED, _dispatch.W8_ONE_ROW_VARIANT):
    if _forced is not None and _forced not in GEMV_VARIANTS:
        names = ", ".join(GEMV_VARIANTS)
        raise ValueError(
            f"GEMV variant {_forced!r} (NINFER_ONE_ROW / NINFER_FEW_ROWS / NINFER_W8_ONE_ROW): one of {names}"
        )
# W8's one-row tiles: the Triton CUDA-core mode. Its Gluon kernel passes its GPU test but did not speed up the
# 35B-A3B groupwise-int decode (C=1 4.07 vs 4.09 ms, bench/results/h200_2026-12-04_session9/decode_q35_int_w8_*.json);
# NINFER_W8_ONE_ROW=pairs_n64s2 picks it
W8_ONE_ROW_VARIANT = _dispatch.W8_ONE_ROW_VARIANT or "fma"
ONE_ROW_TABLE: dict[tuple[str, int, int], str] = {
    ("Q4G64_F16S", 7168, 5120): "pairs_n64",  # attention query_key: 13.1 us (n64s2 13.4)
    ("Q4G64_F16S", 4096, 5120): "pairs_n64",  # GDN query_key: 8.8 us (n64s2 9.5)
    ("Q5G64_F16S", 5120, 6144): "pairs_n32w2",  # attention / GDN output: 13.8 us (n64s2 14.4)
    ("Q5G64_F16S", 5120, 17408): "pairs_n32w2",  # MLP down: 29.8 us (n64s2 32.7)
}
PAIR_MODES = (
    "pairs",
    "mma",
    "ring",
    "mma_ring",
)  # the Gluon kernels' tiles (one bf16 row of x read as 32-bit lane pairs: pairs_ok)
# (format, N, K) -> variant name, from measurements on the H200 (empty until the bench's --variants run)
GEMV_TABLE: dict[tuple[str, int, int], str] = {}
H200_SMS = 132
# programs of the default tiles (128 rows, 4 warps) resident on one SM: their registers (sm_90 cubins of
# bench/kernels/aot_quant.py: Q4 128, W8 116, Q5/Q6 168 a thread) in the 64K-register file
RESIDENT = {4: 4, 5: 3, 6: 3, 8: 4}
# the ring kernels' programs an SM: (mode, bits, block_n, num_warps, step_units, stages) -> min(register-, shared-
# memory-limited), from their sm_90 cubins (bench/kernels/aot_quant.py variants; 228 KiB of shared memory an SM); a
# tile not listed takes 4
RING_RESIDENT = {
    ("ring", 4, 64, 4, 2, 4): 6,  # ring_n64s2: 72 registers, 34 KiB
    ("ring", 5, 64, 4, 2, 4): 5,  # 96 registers, 42 KiB
    ("ring", 6, 64, 4, 2, 4): 4,  # 127 registers, 50 KiB (int16 high halves)
    ("ring", 5, 64, 4, 2, 3): 4,  # ring_n64s2st3: 127 registers
    ("ring", 6, 64, 4, 1, 4): 6,  # ring_n64s1: 80 registers, 25 KiB
    ("ring", 4, 32, 2, 2, 4): 10,  # ring_n32w2s2: 96 registers x 64 threads, 17 KiB
    ("ring", 4, 128, 4, 1, 4): 6,  # ring_n128s1: 80 registers, 34 KiB
    ("ring", 8, 32, 4, 2, 4): 6,  # W8 ring_n32s2: 80 registers, 34 KiB (32 words a row and unit)
    ("ring", 8, 64, 4, 1, 4): 7,  # W8 ring_n64s1: 72 registers, 17 KiB
    ("mma_ring", 4, 64, 4, 2, 4): 6,  # mmaring_n64s2: 72 registers, 34 KiB
    ("mma_ring", 5, 64, 4, 2, 4): 5,  # 80 registers, 42 KiB
    ("mma_ring", 6, 128, 4, 1, 4): 3,  # mmaring_n128s1: 148 registers
    ("mma_ring", 4, 32, 2, 2, 4): 12,  # mmaring_n32w2s2: 72 registers x 64 threads, 17 KiB
}


def _split(units: int, step_units: int, tiles_n: int, min_programs: int) -> int:
    """The smallest divisor ``d`` of ``units`` whose splits are whole steps and give ``tiles_n * d >=
    min_programs`` programs, else the largest such divisor."""
    best = 1
    for d in range(1, units + 1):
        if units % d or (units // d) % step_units:
            continue
        best = d
        if tiles_n * d >= min_programs:
            break
    return best


def _wave_split(units: int, step_units: int, tiles_n: int, slots: int) -> int:
    """The split of K (a divisor of ``units`` in whole steps) with the least estimated time: waves of
    ``slots`` resident programs times the units a program walks (plus one for its prologue, epilogue and
    partials): a grid of 1.06 waves costs nearly two."""
    best, best_cost = 1, float("inf")
    for d in range(1, units + 1):
        if units % d or (units // d) % step_units:
            continue
        cost = -(-tiles_n * d // slots) * (units // d + 1)
        if cost < best_cost:
            best, best_cost = d, cost
    return best


@functools.lru_cache(
    maxsize=1024
)  # called by every GEMV launch (eager steps): a pure function of its arguments
def packed_tiles(
    fmt: str, n: int, k: int, variant: str | None = None, sms: int = H200_SMS, rows: int | None = None
) -> PackedTiles:
    """The tiles of the GEMV-layout GEMV for a [n, k] weight of ``fmt`` on a GPU of ``sms`` SMs (``variant``: a
    ``GEMV_VARIANTS`` name; default: ``GEMV_TABLE``'s entry for the shape, else ``"default"``; one row of x
    (``rows`` 1) takes ``ONE_ROW_VARIANT``, the Gluon one-row kernel; 2..8 rows of Q4/Q5/Q6 ``FEW_ROWS_VARIANT``,
    the tensor-core Gluon kernel). NOTE: batch invariance holds among 2..8 rows (the same tiles whatever T, and
    the MMA kernel's output for a row of x is one column of its C); one row runs another kernel, its output
    within rounding of the batched."""
    assert fmt in GROUP_FORMATS, f"{fmt}: the GEMV layout is for the row-split formats"
    if variant is None and rows == 1:
        default = W8_ONE_ROW_VARIANT if GROUP_FORMATS[fmt].bits == 8 else ONE_ROW_VARIANT
        variant = ONE_ROW_TABLE.get((fmt, n, k), default)
        if ONE_ROW_FORCED and GROUP_FORMATS[fmt].bits != 8:
            variant = ONE_ROW_FORCED
    elif variant is None and rows is not None and rows > 1 and GROUP_FORMATS[fmt].bits != 8:
        variant = FEW_ROWS_FORCED or FEW_ROWS_TABLE.get((fmt, n, k), FEW_ROWS_VARIANT)
    v = GEMV_VARIANTS[variant or GEMV_TABLE.get((fmt, n, k), "default")]
    units = -(-k // UNIT)
    step = v.step_units if units % v.step_units == 0 else 1
    # (the MMA kernel's layout is 16 rows a warp: no smaller tile)
    block_n = max(
        16 * v.num_warps if v.mode in ("mma", "mma_ring") else 16,
        min(v.block_n, 1 << max(0, n - 1).bit_length()),
    )
    tiles_n = -(-n // block_n)
    bits = GROUP_FORMATS[fmt].bits
    resident = RESIDENT[bits]
    if v.mode in ("ring", "mma_ring"):
        resident = RING_RESIDENT.get((v.mode, bits, block_n, v.num_warps, step, v.num_stages), 4)
    if v.min_programs:
        split = _split(units, step, tiles_n, v.min_programs)
    else:
        split = _wave_split(units, step, tiles_n, sms * resident)
    step = (
        1 if GROUP_FORMATS[fmt].bits == 8 and v.mode in PAIR_MODES and v.mode != "ring" else step
    )  # W8's pairs / mma tiles: its Gluon kernel walks one unit a step (its ring kernel takes step_units)
    return PackedTiles(block_n, step, v.num_warps, split, v.mode, v.num_stages)


@functools.lru_cache(maxsize=16)
def device_sms(device: torch.device) -> int:
    """The SM count of a CUDA device (H200_SMS elsewhere: the interpreter)."""
    if device.type != "cuda":
        return H200_SMS
    return torch.cuda.get_device_properties(device).multi_processor_count


def _planes(qw: QuantWeight) -> tuple[torch.Tensor, torch.Tensor]:
    """(int32 code words, the high plane as the kernel reads it: int32 (Q5), int16 (Q6), the words otherwise)"""
    words = qw.codes.view(torch.uint8).view(torch.int32)
    if qw.high is None:
        return words, words
    return words, qw.high.view(torch.int16 if GROUP_FORMATS[qw.format].bits == 6 else torch.int32)


def pairs_ok(x: torch.Tensor, qw: QuantWeight, max_rows: int = 1) -> bool:
    """Whether the Gluon kernels can take this x and weight: up to ``max_rows`` bf16 rows (1 for "pairs", 8 for
    "mma") whose 32-bit words are lane pairs, K a multiple of 128 (no lane masks). (W8 runs its own one-row
    Gluon kernel: bytes, not pair words.)"""
    n, k = qw.shape
    return (
        x.dtype == torch.bfloat16 and x.shape[0] <= max_rows and x.stride(-1) == 1 and x.storage_offset() % 2 == 0
        and (x.shape[0] == 1 or x.stride(0) % 2 == 0) and k % UNIT == 0
    )  # fmt: skip


def _gluon_mode(tiles: PackedTiles, x: torch.Tensor, qw: QuantWeight) -> str | None:
    """The Gluon kernel these tiles run for x ("pairs", "mma", "w8"), or None: a Triton mode runs them."""
    bits = GROUP_FORMATS[qw.format].bits
    if tiles.mode not in PAIR_MODES or not HAS_GLUON or INTERPRET:
        return None
    if bits == 8:
        if not pairs_ok(x, qw):
            return None
        return "w8_ring" if tiles.mode == "ring" and ring_ok(qw) else "w8"
    if tiles.mode == "mma":
        return "mma" if pairs_ok(x, qw, 8) else None
    if tiles.mode == "mma_ring":
        return ("mma_ring" if ring_ok(qw) else "mma") if pairs_ok(x, qw, 8) else None
    if tiles.mode == "ring":
        return "ring" if pairs_ok(x, qw) and ring_ok(qw) else ("pairs" if pairs_ok(x, qw) else None)
    return "pairs" if pairs_ok(x, qw) else None


RING_KERNELS = ("ring", "w8_ring", "mma_ring")  # _gluon_mode's cp.async ring kernels


def ring_ok(qw: QuantWeight) -> bool:
    """Whether the ring kernel's copies can take this weight: the scales read as int32 words (a unit's two fp16
    scales: an even row stride and offset), the planes 16-byte aligned (the cp.async widths: 16 bytes of code
    words, 4 of Q5's high bytes, 8 of Q6's high halves, need their addresses' alignment proven)."""
    sc = qw.scales
    planes = [qw.codes] + ([] if qw.high is None else [qw.high])
    return (
        sc.stride(-1) == 1 and sc.stride(0) % 2 == 0 and sc.storage_offset() % 2 == 0
        and all(p.data_ptr() % 16 == 0 and (p.stride(0) * p.element_size()) % 16 == 0 for p in planes)
    )  # fmt: skip


def gemv_packed(x: torch.Tensor, qw: QuantWeight, tiles: PackedTiles, out: torch.Tensor) -> torch.Tensor:
    """``out = x @ W^T`` (x [T, K], T <= 8; out [T, N] in x's dtype) for a GEMV-layout weight."""
    rows = x.shape[0]
    n, k = qw.shape
    assert qw.gemv_layout, f"{qw.format} weight is in the stored layout: view_planes(..., repack=True)"
    gluon = _gluon_mode(tiles, x, qw)
    if tiles.mode in PAIR_MODES and gluon is None:
        # the interpreter (no Gluon), fp16 x, W8 with rows: the Triton modes
        tiles = tiles._replace(mode="fma" if rows == 1 else "dot")
    assert tiles.mode in ("dot", "mma", "mma_ring") or rows == 1, (
        f"GEMV mode {tiles.mode!r} takes one row of x, got {rows}"
    )
    units = qw.k_pad // UNIT
    assert units % (tiles.split_k * tiles.step_units) == 0, f"{tiles}: {units} units split unevenly"
    target = out
    if tiles.split_k > 1:
        target = torch.empty(tiles.split_k, rows, n, dtype=torch.float32, device=x.device)
    words, high = _planes(qw)
    bits = GROUP_FORMATS[qw.format].bits
    grid = (triton.cdiv(n, tiles.block_n), tiles.split_k)
    # NINFER_SPLITK_REDUCE=last: the ring kernels' last split of a row tile sums the partials (no reduce launch)
    ring = gluon in RING_KERNELS
    last = last_reduces(ring, tiles.split_k, grid[0])
    counts = ticket_counters(x.device) if ring else target  # (also with LAST off: one signature, one compile)
    if gluon == "w8_ring":
        _quant_gemv_w8_ring_kernel[grid](
            x[0], words, qw.scales.view(torch.int32), target, out, counts, n, words.stride(0),
            qw.scales.stride(0) // 2, UNITS_SPLIT=units // tiles.split_k, BLOCK_N=tiles.block_n,
            NUM_WARPS=tiles.num_warps, STEP=tiles.step_units, STAGES=tiles.num_stages, LAST=last,
            num_warps=tiles.num_warps, **pdl_args(x.device),
        )  # fmt: skip
    elif gluon == "w8":
        _quant_gemv_w8_pairs_kernel[grid](
            x[0], words, qw.scales, target, n, words.stride(0), qw.scales.stride(0),
            UNITS_SPLIT=units // tiles.split_k, BLOCK_N=tiles.block_n, NUM_WARPS=tiles.num_warps,
            num_warps=tiles.num_warps, **pdl_args(x.device),
        )  # fmt: skip
    elif gluon is not None:
        if qw.high is not None and bits == 5:
            high = qw.high.view(torch.uint8)  # the Gluon kernels read Q5's high plane a byte a word
        if gluon == "ring":
            _quant_gemv_ring_kernel[grid](
                x[0].view(torch.int32), words, high, qw.scales.view(torch.int32), target, out, counts, n,
                words.stride(0), high.stride(0), qw.scales.stride(0) // 2, BITS=bits,
                UNITS_SPLIT=units // tiles.split_k, BLOCK_N=tiles.block_n, NUM_WARPS=tiles.num_warps,
                STEP=tiles.step_units, STAGES=tiles.num_stages, LAST=last, num_warps=tiles.num_warps,
                **pdl_args(x.device),
            )  # fmt: skip
        elif gluon == "mma_ring":
            xw = x.view(torch.int32) if rows > 1 else x[0].view(torch.int32)[None, :]
            _quant_gemv_mma_ring_kernel[grid](
                xw, words, high, qw.scales.view(torch.int32), target, out, counts, n, xw.stride(0),
                words.stride(0), high.stride(0), qw.scales.stride(0) // 2, T=rows, BITS=bits,
                UNITS_SPLIT=units // tiles.split_k, BLOCK_N=tiles.block_n, NUM_WARPS=tiles.num_warps,
                STEP=tiles.step_units, STAGES=tiles.num_stages, ASM=MMA_GROUP_ASM[bits], LAST=last,
                num_warps=tiles.num_warps, **pdl_args(x.device),
            )  # fmt: skip
        elif gluon == "mma":
            xw = x.view(torch.int32) if rows > 1 else x[0].view(torch.int32)[None, :]
            _quant_gemv_mma_kernel[grid](
                xw, words, high, qw.scales, target, n, xw.stride(0), words.stride(0), high.stride(0),
                qw.scales.stride(0), T=rows, BITS=bits, UNITS_SPLIT=units // tiles.split_k, BLOCK_N=tiles.block_n,
                NUM_WARPS=tiles.num_warps, STEP=tiles.step_units, ASM=MMA_GROUP_ASM[bits],
                num_warps=tiles.num_warps, **pdl_args(x.device),
            )  # fmt: skip
        else:
            _quant_gemv_pairs_kernel[grid](
                x[0].view(torch.int32), words, high, qw.scales, target, n, words.stride(0), high.stride(0),
                qw.scales.stride(0), BITS=bits, UNITS_SPLIT=units // tiles.split_k, BLOCK_N=tiles.block_n,
                NUM_WARPS=tiles.num_warps, STEP=tiles.step_units, num_warps=tiles.num_warps, **pdl_args(x.device),
            )  # fmt: skip
    else:
        _quant_gemv_packed_kernel[grid](
            x, words, high, qw.scales, target, n, rows, k, x.stride(0), words.stride(0), high.stride(0),
            qw.scales.stride(0), BITS=bits, UNITS_SPLIT=units // tiles.split_k,
            STEP_UNITS=tiles.step_units, BLOCK_N=tiles.block_n, MODE=MODES[tiles.mode], EVEN_K=k % UNIT == 0,
            ASM=not INTERPRET, num_warps=tiles.num_warps, num_stages=tiles.num_stages, **pdl_args(x.device),
        )  # fmt: skip
    if tiles.split_k > 1 and not last:
        _linear_reduce_kernel[(triton.cdiv(n, REDUCE_BLOCK), rows)](
            target, out, n, SPLIT_K=tiles.split_k, BLOCK=REDUCE_BLOCK, num_warps=4, **pdl_args(x.device)
        )
    return out


def last_reduces(ring: bool, split_k: int, row_tiles: int) -> bool:
    """Whether a ring GEMV's (one-row or MMA) last split sums its row tile's partials itself (``NINFER_SPLITK_REDUCE=last``, K split,
    a ticket counter for every row tile) instead of the reduce launch after it."""
    return ring and split_k > 1 and _dispatch.SPLITK_REDUCE == "last" and row_tiles <= TICKET_COUNTERS


def dequantize_packed_to(qw: QuantWeight, out: torch.Tensor) -> torch.Tensor:
    """The represented weight [N, K] of a GEMV-layout weight rounded once to out's dtype, into ``out``."""
    n, k = qw.shape
    words, high = _planes(qw)
    _quant_dequant_packed_kernel[(triton.cdiv(n, 32), qw.k_pad // UNIT)](
        words, high, qw.scales, out, n, k, words.stride(0), high.stride(0), qw.scales.stride(0), out.stride(0),
        BITS=GROUP_FORMATS[qw.format].bits, BLOCK_N=32, num_warps=4,
    )  # fmt: skip
    return out
