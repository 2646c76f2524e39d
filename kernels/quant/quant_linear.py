"""The linear layer on a quantized weight, ``y = x @ W^T`` (no bias): reference, launcher and launch tiles.

``quant_linear_ref`` is the specification: the exact dequantized weight (``dequantize``), a float32 matmul,
one rounding to x's dtype; it is what the CPU runs. ``quant_linear`` runs, when Triton runs on the tensors'
device (``kernels._dispatch.use_triton``) and x is bf16 or fp16:

- at most ``GEMV_MAX_ROWS`` rows (decode): the weight-streaming GEMV of the format (``triton_group.py``,
  ``triton_fp.py``): the weight's planes read once, dequantized in registers, no bf16 copy of the weight;
  the tiles depend on the weight's shape only, so a row's output is bitwise the same in any batch. A
  row-split weight repacked at load (``QuantWeight.gemv_layout``: what the model's layers hold on a GPU)
  runs the GEMV layout's kernel instead (``packed_linear.py``, ``triton_gemv.py``);
- more rows (prefill): ``route="dequant"``: slabs of weight rows dequantized to x's dtype (one rounding
  of each weight) and multiplied by cuBLAS; on the H200 (bench/results/kernels_quant_h200_2026-12-03_session5)
  it ran at 0.80-0.94 of cuBLAS bf16 on every 27B shape, the format's Triton GEMM (weight tiles dequantized
  in registers before ``tl.dot``, ``route="gemm"``) at 0.16-0.59;
  FP8 rows on a GPU with FP8 tensor cores (sm_89 and later: Hopper, Blackwell) go through
  ``torch._scaled_mm`` instead, with x quantized to E4M3 per row (W8A8: x's per-row scale ``amax / 448``,
  the weight's row scales as the other side).

Everything else (CPU, fp32 x, ``NINFER_KERNELS=ref``) runs the reference. ``route`` forces one path (the
bench and the tests use it). NVFP4's W4A4 path (the site's input divisor, FP4 tensor cores through
``tl.dot_scaled`` on sm_100/sm_120) is not built yet: NVFP4 runs A16 everywhere (exact bf16 weight tiles).
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch

from kernels._dispatch import FP_ONE_ROW, HAS_TRITON, INTERPRET, use_triton
from kernels.pdl import pdl_args
from kernels.quant.formats import FP8, GROUP_FORMATS, NVFP4
from kernels.quant.gluon_gemv import HAS_GLUON
from kernels.quant.packed_linear import (
    H200_SMS,
    PackedTiles,
    _wave_split,
    dequantize_packed_to,
    device_sms,
    gemv_packed,
    last_reduces,
    packed_tiles,
)
from kernels.quant.weight import QuantWeight, dequantize

if HAS_TRITON:
    import triton

    from kernels.linear import REDUCE_BLOCK, _linear_reduce_kernel, ticket_counters

    if HAS_GLUON:
        from kernels.quant.gluon_gemv import (
            _quant_gemv_fp8_ring_kernel,
            _quant_gemv_fp8_rows_kernel,
            _quant_gemv_nvfp4_ring_kernel,
            _quant_gemv_nvfp4_rows_kernel,
        )
    from kernels.quant.triton_fp import (
        _quant_dequant_fp_kernel,
        _quant_gemm_fp8_kernel,
        _quant_gemm_nvfp4_kernel,
        _quant_gemv_fp8_kernel,
        _quant_gemv_nvfp4_kernel,
    )
    from kernels.quant.triton_group import (
        _quant_dequant_group_kernel,
        _quant_gemm_group_kernel,
        _quant_gemv_group_kernel,
    )

GEMV_MAX_ROWS = 8  # more rows of x than this take the prefill route
ROUTES = ("gemv", "gemm", "dequant", "scaled_mm", "ref")
DEQUANT_CHUNK_BYTES = 64 << 20  # the "dequant" route's bf16 slab of weight rows
# K is split while the row tiles alone give fewer programs than this: about 8 resident programs an SM of an
# H200 (132 SMs), so that each SM has ~8 loop steps of weight bytes (4-16 KiB each) in flight at once
MIN_PROGRAMS = 1024
MAX_SPLIT_K = 32
MIN_SPLIT_STEPS = 1  # loop steps a split at least


def quant_linear_ref(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """``x @ W^T`` with ``W = dequantize(qw)`` (exact), in float32, rounded once to x's dtype.

    x: [T, K]; qw: a [N, K] quantized weight -> [T, N] (x's dtype).
    """
    return (x.float() @ dequantize(qw).t()).to(x.dtype)


class QuantTiles(NamedTuple):
    """Launch shape of a quantized GEMV or GEMM (a function of the format and the weight's shape only)."""

    block_n: int  # weight rows a program
    block_k: int  # K columns a loop step (a multiple of the group / scale block)
    num_warps: int
    split_k: int  # GEMV: programs along K (fp32 partials + the reduce kernel when > 1); GEMM: 1
    num_stages: int
    block_t: int = 16  # GEMM: rows of x a program (the GEMV takes all T <= 8 as the dot's 16 columns)
    mode: str = "dot"  # "rows" / "ring": the FP8 / NVFP4 Gluon one-row GEMV (one_row_tiles; block_k its step in lanes)
    step_units: int = 1  # "ring": loop steps a ring slot (num_stages: the slots)


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def gemv_split(steps: int, tiles_n: int, min_programs: int = MIN_PROGRAMS) -> int:
    """The programs along K of a GEMV with ``tiles_n`` row tiles and ``steps`` loop steps a row: the smallest
    divisor of ``steps`` (each split a whole number of steps, at least ``MIN_SPLIT_STEPS``, at most
    ``MAX_SPLIT_K`` splits) that gives ``min_programs`` programs, else the largest such divisor."""
    best = 1
    for split in range(1, min(MAX_SPLIT_K, steps // MIN_SPLIT_STEPS) + 1):
        if steps % split == 0:
            best = split
            if tiles_n * split >= min_programs:
                break
    return best if tiles_n < min_programs else 1


def gemv_tiles(
    fmt: str, n: int, k: int, block_n: int = 32, step_bytes: int = 0, num_warps: int = 4, num_stages: int = 4,
    min_programs: int = MIN_PROGRAMS,
) -> QuantTiles:  # fmt: skip
    """The GEMV tiles for a [n, k] weight of ``fmt``. NOTE: never a function of the row count T (batch invariance).

    Default: 32 weight rows a program, 4 warps, 4 stages; a step is 256 columns for the groupwise formats (4
    groups of 64, 8 of 32 for W8, fewer when K_pad has fewer) and NVFP4 (128 code bytes, 16 scales), 512 for
    FP8 (512 code bytes). ``step_bytes`` (the bench's sweep) sets a step's code bytes a row instead (128 is
    the default's Q4 / NVFP4 step). K is split (``gemv_split``) while the row tiles give fewer than
    ``min_programs`` programs: a decode GEMV is bound by the bytes in flight (little work a byte), and at the
    27B's N = 4096 .. 12288 the row tiles alone give 1 .. 3 programs an SM of an H200.
    """
    block_n = min(block_n, max(16, _pow2(n)))
    if fmt in GROUP_FORMATS:
        spec = GROUP_FORMATS[fmt]
        group = spec.group_size
        steps = -(-k // 128) * 128 // group  # groups a row
        lanes = step_bytes * 8 // (4 if spec.bits < 8 else 8) if step_bytes else 256
        per_step = max(1, lanes // group)
        while steps % per_step:
            per_step //= 2
        block_k = per_step * group
    elif fmt == NVFP4:
        block_k = min(2 * step_bytes, 1024) if step_bytes else 256
        while k % block_k:
            block_k //= 2
    else:
        block_k = min(step_bytes or 512, max(16, _pow2(k)))
    tiles_n = -(-n // block_n)
    k_pad = -(-k // 128) * 128 if fmt in GROUP_FORMATS else k
    split = gemv_split(k_pad // block_k, tiles_n, min_programs) if k_pad % block_k == 0 else 1
    return QuantTiles(block_n, block_k, num_warps, split, num_stages)


ONE_ROW_STEP = {FP8: 64, NVFP4: 128}  # lanes a loop step of the Gluon one-row GEMVs (16 bytes a thread a row)


def one_row_ok(x: torch.Tensor, qw: QuantWeight) -> bool:
    """Whether the Gluon one-row GEMV of FP8 rows or NVFP4 can take x and the weight: a GPU Triton with Gluon,
    one bf16 row of x whose 32-bit words are lane pairs, K a multiple of the kernel's step."""
    return (
        HAS_GLUON and not INTERPRET and qw.format in ONE_ROW_STEP and x.dtype == torch.bfloat16
        and x.shape[0] == 1 and x.stride(-1) == 1 and x.storage_offset() % 2 == 0
        and qw.shape[1] % ONE_ROW_STEP[qw.format] == 0
    )  # fmt: skip


# the ring kernels' programs an SM (64 rows, 4 warps, 4 slots of 2 steps; sm_90 cubins of bench/kernels/aot_quant.py:
# NVFP4 96 registers and 36 KiB, FP8 59 registers and 32 KiB)
RING_RESIDENT = {NVFP4: 5, FP8: 6}


@functools.lru_cache(maxsize=1024)  # called by every one-row launch (eager steps)
def one_row_tiles(fmt: str, n: int, k: int, mode: str | None = None) -> QuantTiles:
    """The tiles of the FP8 / NVFP4 one-row GEMV: 64 rows a program (2 a thread), 4 warps. ``mode`` (default
    ``NINFER_FP_ONE_ROW``): "rows", K split for ``MIN_PROGRAMS``; "ring" (the cp.async ring kernels: 4 slots of 2
    steps, 1 when the steps are odd), K split for whole waves of its resident programs (``packed_linear``'s
    ``_wave_split``)."""
    step = ONE_ROW_STEP[fmt]
    steps = k // step
    tiles_n = -(-n // 64)
    if (mode or FP_ONE_ROW) == "ring":
        units = 2 if steps % 2 == 0 else 1
        split = _wave_split(steps, units, tiles_n, H200_SMS * RING_RESIDENT[fmt])
        return QuantTiles(64, step, 4, split, 4, mode="ring", step_units=units)
    return QuantTiles(64, step, 4, gemv_split(steps, tiles_n), 1, mode="rows")


def gemm_tiles(fmt: str, n: int, k: int, rows: int) -> QuantTiles:
    """The GEMM tiles: 128 weight rows x up to 128 rows of x a program, 8 warps, 3 stages; a K step of 64 for
    the groupwise formats (one G64 group, two W8 groups) and 128 for NVFP4 / FP8."""
    block_t = min(128, max(16, _pow2(rows)))
    block_k = 64 if fmt in GROUP_FORMATS else 128 if fmt == FP8 or k % 128 == 0 else 64
    return QuantTiles(min(128, max(16, _pow2(n))), block_k, 8, 1, 3, block_t)


@functools.lru_cache(maxsize=16)
def _has_fp8_mma(device: torch.device) -> bool:
    return device.type == "cuda" and torch.cuda.get_device_capability(device) >= (8, 9)


def _check(x: torch.Tensor, qw: QuantWeight) -> None:
    assert x.dim() == 2, f"x {tuple(x.shape)}: need [T, K]"
    assert x.shape[1] == qw.shape[1], f"x {tuple(x.shape)} and {qw.format} weight {qw.shape}: K differs"
    assert x.is_floating_point(), f"x is {x.dtype}"
    assert x.device == qw.device, f"x on {x.device}, weight on {qw.device}"
    assert x.stride(1) == 1 or x.shape[1] <= 1, f"x needs unit stride along K, has strides {x.stride()}"


def _route(x: torch.Tensor, qw: QuantWeight) -> str:
    if x.shape[0] == 0 or x.dtype not in (torch.bfloat16, torch.float16) or not use_triton(x, qw.codes):
        return "ref"
    if x.shape[0] <= GEMV_MAX_ROWS:
        return "gemv"
    n, k = qw.shape
    if qw.format == FP8 and _has_fp8_mma(x.device) and n % 16 == 0 and k % 16 == 0:
        return "scaled_mm"
    return "dequant"


def quant_linear(
    x: torch.Tensor,
    qw: QuantWeight,
    route: str | None = None,
    tiles: QuantTiles | PackedTiles | None = None,
) -> torch.Tensor:
    """Launcher for ``quant_linear_ref``'s contract, ``x @ W^T``: the GEMV for at most 8 rows and the GEMM
    above (bf16 slabs + cuBLAS; ``torch._scaled_mm`` for FP8 rows on FP8 tensor cores), on CUDA; the
    reference elsewhere (see the module docstring). ``route`` (one of ``ROUTES``) and ``tiles`` override it.
    A GEMV-layout weight (``qw.gemv_layout``) runs ``packed_linear.gemv_packed`` (``tiles``: ``PackedTiles``)
    and takes the "dequant" route for the GEMM.

    x: [T, K] bf16 or fp16 for the kernels (any float dtype for the reference), unit stride along K;
    qw: [N, K] on x's device -> [T, N] (x's dtype).
    """
    _check(x, qw)
    route = route or _route(x, qw)
    if route == "ref":
        return quant_linear_ref(x, qw)
    if route == "scaled_mm":
        return _scaled_mm_fp8(x, qw)
    if route == "dequant":
        return _dequant_linear(x, qw)
    assert route in ("gemv", "gemm"), f"route {route!r}: one of {ROUTES}"
    n, k = qw.shape
    rows = x.shape[0]
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if rows == 0:
        return out
    if route == "gemv":
        assert rows <= GEMV_MAX_ROWS, f"{rows} rows: the GEMV takes 1..{GEMV_MAX_ROWS}"
        if qw.gemv_layout:
            assert tiles is None or isinstance(tiles, PackedTiles), f"{tiles}: a GEMV-layout weight"
            tiles = tiles or packed_tiles(qw.format, n, k, sms=device_sms(x.device), rows=rows)
            return gemv_packed(x, qw, tiles, out)
        assert tiles is None or isinstance(tiles, QuantTiles), f"{tiles}: a stored-layout weight"
        if tiles is None and rows == 1 and one_row_ok(x, qw):
            tiles = one_row_tiles(qw.format, n, k)
        return _gemv(x, qw, tiles or gemv_tiles(qw.format, n, k), out)
    if qw.gemv_layout:
        return _dequant_linear(x, qw)
    assert tiles is None or isinstance(tiles, QuantTiles), f"{tiles}: GEMM tiles"
    return _gemm(x, qw, tiles or gemm_tiles(qw.format, n, k, rows), out)


def _gemv(x: torch.Tensor, qw: QuantWeight, tiles: QuantTiles, out: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    n, k = qw.shape
    target = out
    if tiles.split_k > 1:
        target = torch.empty(tiles.split_k, rows, n, dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(n, tiles.block_n), tiles.split_k)
    common = dict(BLOCK_N=tiles.block_n, NUM_STAGES=tiles.num_stages, num_warps=tiles.num_warps)
    last = False  # the ring kernels' last split reduces (below)
    if qw.format in GROUP_FORMATS:
        spec = GROUP_FORMATS[qw.format]
        groups = qw.k_pad // spec.group_size
        per_step = tiles.block_k // spec.group_size
        assert groups % (tiles.split_k * per_step) == 0, (
            f"{tiles}: K_pad {qw.k_pad} is no whole number of steps"
        )
        high = qw.high if qw.high is not None else qw.codes
        _quant_gemv_group_kernel[grid](
            x, qw.codes, high, qw.scales, target, n, rows, k, x.stride(0), qw.codes.stride(0), high.stride(0),
            qw.scales.stride(0), BITS=spec.bits, GROUP=spec.group_size, GROUPS_SPLIT=groups // tiles.split_k,
            GROUPS_STEP=per_step, **common, **pdl_args(x.device),
        )  # fmt: skip
    elif tiles.mode in ("rows", "ring"):
        assert one_row_ok(x, qw), f"{tiles}: one bf16 row on a GPU with Gluon, K a whole number of steps"
        if tiles.mode == "ring" and any(t.data_ptr() % 16 for t in (qw.codes, qw.scales)):
            # (the ring's cp.async widths need 16-byte aligned planes proven at compile time)
            tiles = one_row_tiles(qw.format, n, k, "rows")._replace(split_k=tiles.split_k)
        steps = k // tiles.block_k
        assert steps % tiles.split_k == 0, f"{tiles}: K={k} splits unevenly"
        words = qw.codes.view(torch.int32)
        if tiles.mode == "ring":
            assert steps // tiles.split_k % tiles.step_units == 0, (
                f"{tiles}: a split is no whole number of slots"
            )
            last = last_reduces(True, tiles.split_k, grid[0])  # (NINFER_SPLITK_REDUCE=last: no reduce launch)
            counts = ticket_counters(x.device)  # (also when unused: one signature, one compile)
            ring = dict(
                STEPS_SPLIT=steps // tiles.split_k, BLOCK_N=tiles.block_n, NUM_WARPS=tiles.num_warps,
                STEP=tiles.step_units, STAGES=tiles.num_stages, LAST=last, num_warps=tiles.num_warps,
            )  # fmt: skip
            if qw.format == FP8:
                _quant_gemv_fp8_ring_kernel[grid](
                    x[0].view(torch.int32), words, qw.scales, target, out, counts, n, words.stride(0), **ring,
                    **pdl_args(x.device),
                )  # fmt: skip
            else:
                _quant_gemv_nvfp4_ring_kernel[grid](
                    x[0].view(torch.int32), words, qw.scales, target, out, counts, n, words.stride(0),
                    qw.scales.stride(0),
                    16384.0 / qw.divisor, **ring, **pdl_args(x.device),
                )  # fmt: skip
        elif qw.format == FP8:
            _quant_gemv_fp8_rows_kernel[grid](
                x[0].view(torch.int32), words, qw.scales, target, n, words.stride(0),
                STEPS_SPLIT=steps // tiles.split_k, BLOCK_N=tiles.block_n, NUM_WARPS=tiles.num_warps,
                num_warps=tiles.num_warps, **pdl_args(x.device),
            )  # fmt: skip
        else:
            _quant_gemv_nvfp4_rows_kernel[grid](
                x[0].view(torch.int32), words, qw.scales, target, n, words.stride(0), qw.scales.stride(0),
                16384.0 / qw.divisor, STEPS_SPLIT=steps // tiles.split_k, BLOCK_N=tiles.block_n,
                NUM_WARPS=tiles.num_warps, num_warps=tiles.num_warps, **pdl_args(x.device),
            )  # fmt: skip
    elif qw.format == NVFP4:
        assert k % (tiles.split_k * tiles.block_k) == 0, f"{tiles}: K={k} is no whole number of steps"
        _quant_gemv_nvfp4_kernel[grid](
            x, qw.codes, qw.scales, target, n, rows, x.stride(0), qw.codes.stride(0), qw.scales.stride(0),
            qw.divisor, K_SPLIT=k // tiles.split_k, BLOCK_K=tiles.block_k, **common, **pdl_args(x.device),
        )  # fmt: skip
    else:
        assert tiles.split_k == 1 or k % (tiles.split_k * tiles.block_k) == 0, (
            f"{tiles}: K={k} splits unevenly"
        )
        _quant_gemv_fp8_kernel[grid](
            x, qw.codes, qw.scales, target, n, rows, x.stride(0), qw.codes.stride(0),
            K_SPLIT=k // tiles.split_k, BLOCK_K=tiles.block_k, **common, **pdl_args(x.device),
        )  # fmt: skip
    if tiles.split_k > 1 and not last:
        _linear_reduce_kernel[(triton.cdiv(n, REDUCE_BLOCK), rows)](
            target, out, n, SPLIT_K=tiles.split_k, BLOCK=REDUCE_BLOCK, num_warps=4, **pdl_args(x.device)
        )
    return out


def _gemm(x: torch.Tensor, qw: QuantWeight, tiles: QuantTiles, out: torch.Tensor) -> torch.Tensor:
    rows = x.shape[0]
    n, k = qw.shape
    grid = (triton.cdiv(n, tiles.block_n), triton.cdiv(rows, tiles.block_t))
    common = dict(
        BLOCK_N=tiles.block_n, BLOCK_T=tiles.block_t, BLOCK_K=tiles.block_k, NUM_STAGES=tiles.num_stages,
        num_warps=tiles.num_warps,
    )  # fmt: skip
    if qw.format in GROUP_FORMATS:
        spec = GROUP_FORMATS[qw.format]
        assert tiles.block_k % spec.group_size == 0 and qw.k_pad % tiles.block_k == 0, f"{tiles}: bad K step"
        high = qw.high if qw.high is not None else qw.codes
        _quant_gemm_group_kernel[grid](
            x, qw.codes, high, qw.scales, out, n, rows, k, x.stride(0), qw.codes.stride(0), high.stride(0),
            qw.scales.stride(0), BITS=spec.bits, GROUP=spec.group_size, K_PAD=qw.k_pad, **common,
        )  # fmt: skip
    elif qw.format == NVFP4:
        assert k % tiles.block_k == 0 and tiles.block_k % 64 == 0, (
            f"{tiles}: K={k} is no whole number of steps"
        )
        _quant_gemm_nvfp4_kernel[grid](
            x, qw.codes, qw.scales, out, n, rows, x.stride(0), qw.codes.stride(0), qw.scales.stride(0),
            qw.divisor, K=k, **common,
        )  # fmt: skip
    else:
        _quant_gemm_fp8_kernel[grid](
            x, qw.codes, qw.scales, out, n, rows, x.stride(0), qw.codes.stride(0), K=k, **common
        )
    return out


def dequantize_to(qw: QuantWeight, dtype: torch.dtype, out: torch.Tensor | None = None) -> torch.Tensor:
    """The represented weight [N, K] rounded once to ``dtype`` (bf16/fp16), by a Triton kernel on the weight's
    device: the reference's ``dequantize(qw).to(dtype)``, bitwise on a GPU. ``out``: a [N, K] tensor to fill."""
    n, k = qw.shape
    out = torch.empty(n, k, dtype=dtype, device=qw.device) if out is None else out
    assert out.shape == (n, k) and out.stride(1) == 1, f"out {tuple(out.shape)} strides {out.stride()}"
    if qw.gemv_layout:
        return dequantize_packed_to(qw, out)
    if qw.format in GROUP_FORMATS:
        spec = GROUP_FORMATS[qw.format]
        high = qw.high if qw.high is not None else qw.codes
        _quant_dequant_group_kernel[(triton.cdiv(n, 32), qw.k_pad // 128)](
            qw.codes, high, qw.scales, out, n, k, qw.codes.stride(0), high.stride(0), qw.scales.stride(0),
            out.stride(0), BITS=spec.bits, GROUP=spec.group_size, BLOCK_N=32, BLOCK_K=128, num_warps=4,
        )  # fmt: skip
    else:
        nvfp4 = qw.format == NVFP4
        tile_stride = qw.scales.stride(0) if nvfp4 else 0
        _quant_dequant_fp_kernel[(triton.cdiv(n, 32), triton.cdiv(k, 64 if nvfp4 else 128))](
            qw.codes, qw.scales, out, n, k, qw.codes.stride(0), tile_stride, out.stride(0), qw.divisor,
            NVFP4=nvfp4, BLOCK_N=32, BLOCK_K=64 if nvfp4 else 128, num_warps=4,
        )  # fmt: skip
    return out


def _dequant_linear(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """Prefill through cuBLAS: slabs of weight rows (``DEQUANT_CHUNK_BYTES`` of x's dtype, whole 128-row tiles)
    dequantized by ``dequantize_to`` into one reused buffer, each multiplied by ``torch.matmul``."""
    n, k = qw.shape
    rows = x.shape[0]
    chunk = max(128, DEQUANT_CHUNK_BYTES // (x.element_size() * k) // 128 * 128)
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    buf = torch.empty(min(chunk, n), k, dtype=x.dtype, device=x.device)
    for r0 in range(0, n, chunk):
        count = min(chunk, n - r0)
        w = dequantize_to(qw.rows(r0, count), x.dtype, buf[:count])
        out[:, r0 : r0 + count] = x @ w.t()
    return out


def _scaled_mm_fp8(x: torch.Tensor, qw: QuantWeight) -> torch.Tensor:
    """FP8 rows on the FP8 tensor cores: x quantized to E4M3 per row (scale ``amax / 448``), W8A8 with fp32
    row scales on both sides, output in x's dtype."""
    assert qw.format == FP8, f"the scaled_mm route is for {FP8}, not {qw.format}"
    xf = x.float()
    x_scale = xf.abs().amax(dim=1, keepdim=True).clamp_min(1e-12) / 448.0
    xq = (xf / x_scale).clamp(-448.0, 448.0).to(torch.float8_e4m3fn)
    w = qw.codes.view(torch.float8_e4m3fn)
    w_scale = qw.scales.float()[None, :].contiguous()
    return torch._scaled_mm(xq, w.t(), scale_a=x_scale, scale_b=w_scale, out_dtype=x.dtype)
