"""Bias-free linear layers ``y = x @ weight^T`` for decode-sized batches: a weight-streaming Triton GEMV.

``linear_ref`` is the specification (float32 math, one rounding to x's dtype). The launcher ``linear`` runs
the Triton GEMV when ``use_gemv`` says so (Triton on the tensors' device, at most ``GEMV_MAX_ROWS`` rows, and
``NINFER_GEMV=on``, or ``auto`` (the default) with a weight shape that ``GEMV_FASTER`` lists as measured faster
than cuBLAS on that GPU: see ``kernels._dispatch``) and ``F.linear`` (cuBLAS on CUDA) everywhere else, so
prefill, the CPU path and ``off`` are exactly what they were.

Why a GEMV of its own: at batch 1..8 a linear layer reads its whole weight once for a few FLOPs per byte, so
its time is the weight's bytes over the read bandwidth; cuBLAS leaves some of that on the table. Measured on an
H200 (``GEMV_FASTER``): the GEMV streams the 27B MLP and lm_head weights at 3.6-4.4 TB/s (1.01-1.08x cuBLAS)
and every 35B-A3B projection but its qkv 1.06-1.2x faster, but loses on the 27B qkv, o_proj / out_proj and GDN
in_proj (0.74-0.93x), which stay on cuBLAS under ``auto``.

NOTE: timed alone, the per-shape gains added up to 0.13 ms a 35B-A3B decode step (and a 0.39 ms loss on the 27B),
but inside the CUDA-graphed model the GEMV everywhere (``on``) cost 0.05 ms (35B-A3B) and 0.89 ms (27B) a step
against cuBLAS (bench/results/bench_*_session4_gemv_on.json vs bench_decode_gemv_off_*): something the isolated
timing does not see (cuBLAS' kernels overlapping their neighbours' launch, the split-K reduce launches) costs
~0.2-0.5 ms a step. ``auto`` on only the shapes of ``GEMV_FASTER`` measured end to end on the H200 (2026-12-04): 35B-A3B
decode C=1 3.01 ms a step against 3.10 with cuBLAS (the 27B's shapes, which cost its step 0.07 ms, left the
table), so ``auto`` is the default.

``_linear_gemv_kernel``, grid ``(cdiv(N, BLOCK_N), SPLIT_K)`` (the weight-row tiles the fastest axis): one
program computes ``out^T [BLOCK_N, 16] = w [BLOCK_N, K / SPLIT_K] @ x^T`` for its rows of the weight and its
split of K, one tensor-core dot (``tl.dot``, fp32 accumulate) per ``BLOCK_K`` step, x's T rows being the
dot's 16 columns (rows past T load as zeros and are never stored). The K loop is software-pipelined
(``NUM_STAGES``): the weight and x tiles of the next steps are copied asynchronously into shared memory
(16-byte copies) while the current step's dot runs, so each program keeps several weight tiles in flight
without holding them in registers, and the weight is read from HBM once for the whole batch. Weight rows
past N are clamped to N - 1 (unmasked loads; those outputs are not stored). With ``SPLIT_K == 1`` the
program stores its outputs in x's dtype; with ``SPLIT_K > 1`` each split stores fp32 partials
``[SPLIT_K, T, N]`` and ``_linear_reduce_kernel`` (grid ``(cdiv(N, BLOCK), T)``) sums them in split order,
then rounds once. Under ``NINFER_SPLITK_REDUCE=last`` no reduce launch follows: each split takes a ticket
from its row tile's counter (``ticket_counters``; an atomic add, acq_rel at GPU scope, after a CTA barrier) and
the tile's last split to finish sums the tile's partials in the same split order and stores the rounded
outputs (bitwise the reduce kernel's), then resets the counter. No atomics touch the data.

Batch invariance: the tiles are ``gemv_tiles(N, K, dtype)``, never a function of T, and T is not a
compile-time constant of the kernel: every T in 1..8 runs the same compiled code, in which T only masks
which columns of the x tile are loaded and stored. A dot computes each output column from its own column of
x alone, in a fixed order, so a row's output is bitwise the same alone or in any batch (the GPU tests check
it for every row position). No host sync, fixed shapes: the launch can be captured in a CUDA graph.

NOTE: Triton 3.6's interpreter multiplies bf16 ``tl.dot`` operands as raw integers; the interpreter tests
widen them first (``interpreter_fixes`` in tests/kernels/conftest.py). On a GPU nothing changes.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import torch.nn.functional as F

from kernels import _dispatch
from kernels._dispatch import HAS_TRITON, use_triton

if HAS_TRITON:
    import triton
    import triton.language as tl

GEMV_MAX_ROWS = 8  # more rows of x than this (prefill) go to F.linear


def linear_ref(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``x @ weight^T`` in float32, rounded once to x's dtype (no bias).

    x: [T, K]; weight: [N, K] -> [T, N] (dtype of x).
    """
    return (x.float() @ weight.float().t()).to(x.dtype)


if HAS_TRITON:

    @triton.jit
    def gemv_split_tile(
        x_ptr,
        w_ptr,
        rows,
        ts,
        t_mask,
        split,
        N,
        x_stride,
        w_stride,
        K_SPLIT: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        BLOCK_T: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        # The fp32 sums [BLOCK_N, BLOCK_T] = w[rows, split's K_SPLIT columns] @ x^T[those columns, ts] (rows
        # past N clamped to N - 1, never masked; columns of x past T loaded as zeros): the loop of
        # _linear_gemv_kernel, shared with kernels.moe_router's fused router so its logits are the GEMV's bits.
        EVEN_K: tl.constexpr = K_SPLIT % BLOCK_K == 0
        w_rows = tl.minimum(rows, N - 1).to(tl.int64) * w_stride  # clamped: no row mask on the loads
        cols = tl.arange(0, BLOCK_K)
        k_base = split * K_SPLIT
        w_ptrs = w_ptr + w_rows[:, None] + (k_base + cols)[None, :]  # [BLOCK_N, BLOCK_K]
        x_ptrs = x_ptr + ts[None, :].to(tl.int64) * x_stride + (k_base + cols)[:, None]  # [BLOCK_K, BLOCK_T]
        acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
        for k0 in tl.range(0, K_SPLIT, BLOCK_K, num_stages=NUM_STAGES):
            if EVEN_K:
                w = tl.load(w_ptrs + k0)
                xt = tl.load(x_ptrs + k0, mask=t_mask, other=0.0)
            else:
                k_mask = cols < K_SPLIT - k0
                w = tl.load(w_ptrs + k0, mask=k_mask[None, :], other=0.0)
                xt = tl.load(x_ptrs + k0, mask=t_mask & k_mask[:, None], other=0.0)
            if IEEE:  # fp32 weights: full-precision products (the default would round them to tf32)
                acc = tl.dot(w, xt, acc, input_precision="ieee")
            else:
                acc = tl.dot(w, xt, acc)
        return acc

    @triton.jit
    def _linear_gemv_kernel(
        x_ptr,
        w_ptr,
        out_ptr,
        count_ptr,
        final_ptr,
        N,
        T,
        x_stride,
        w_stride,
        K_SPLIT: tl.constexpr,
        SPLIT_K: tl.constexpr,
        LAST_REDUCES: tl.constexpr,
        BLOCK_N: tl.constexpr,
        BLOCK_K: tl.constexpr,
        NUM_STAGES: tl.constexpr,
        IEEE: tl.constexpr,
    ):
        # grid (cdiv(N, BLOCK_N), SPLIT_K): out^T [BLOCK_N, BLOCK_T] = w [BLOCK_N, K_SPLIT] @ x^T [K_SPLIT,
        # BLOCK_T] for the weight rows of program_id(0) and the K_SPLIT columns of split program_id(1) (see
        # the module docstring). out: [T, N] in x's dtype (one split) or fp32 partials [SPLIT_K, T, N]. Only
        # an unsplit K can end in a partial step (the launcher splits K into whole steps). K_SPLIT is a
        # constexpr: a loop bound that is a run-time argument breaks Triton 3.6's interpreter under numpy 2.
        BLOCK_T: tl.constexpr = 16
        tile = tl.program_id(0)
        split = tl.program_id(1)
        rows = tile * BLOCK_N + tl.arange(0, BLOCK_N)
        ts = tl.arange(0, BLOCK_T)
        t_mask = (ts < T)[None, :]
        acc = gemv_split_tile(
            x_ptr, w_ptr, rows, ts, t_mask, split, N, x_stride, w_stride, K_SPLIT, BLOCK_N, BLOCK_K, BLOCK_T,
            NUM_STAGES, IEEE,
        )  # fmt: skip
        tile_ptrs = ts[None, :] * N + rows[:, None]  # [BLOCK_N, BLOCK_T]
        out_mask = (rows < N)[:, None] & t_mask
        tl.store(out_ptr + split * (T * N) + tile_ptrs, acc.to(out_ptr.dtype.element_ty), mask=out_mask)
        if LAST_REDUCES:
            # the row tile's last split to finish sums the tile's SPLIT_K partials in split order (what
            # _linear_reduce_kernel does) into final; tickets and their release/acquire: kernels/moe_router.py
            tl.debug_barrier()
            ticket = tl.atomic_add(count_ptr + tile, 1, sem="acq_rel", scope="gpu")
            if ticket == SPLIT_K - 1:
                tl.store(count_ptr + tile, 0)  # the next launch starts from 0 (kernel boundaries order it)
                tl.debug_barrier()
                total = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
                for s in tl.static_range(SPLIT_K):
                    part = out_ptr + s * (T * N) + tile_ptrs
                    total += tl.load(part, mask=out_mask, other=0.0, cache_modifier=".cg")
                tl.store(final_ptr + tile_ptrs, total.to(final_ptr.dtype.element_ty), mask=out_mask)

    @triton.jit
    def _linear_reduce_kernel(part_ptr, out_ptr, N, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
        # grid (cdiv(N, BLOCK), T): out[t, n] = sum over s = 0, 1, .. SPLIT_K - 1 (in that order) of the fp32
        # partials part[s, t, n], rounded once to out's dtype.
        t = tl.program_id(1)
        rows = tl.num_programs(1)
        cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = cols < N
        acc = tl.zeros([BLOCK], dtype=tl.float32)
        for s in tl.static_range(SPLIT_K):
            acc += tl.load(part_ptr + (s * rows + t) * N + cols, mask=mask, other=0.0)
        tl.store(out_ptr + t * N + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


class GemvTiles(NamedTuple):
    """Launch shape of ``_linear_gemv_kernel`` (a function of N, K and the dtype only: see the module
    docstring). block_n and block_k are powers of two of at least 16 (a tensor-core dot's minimum); K / split_k
    is a multiple of block_k when split_k > 1."""

    block_n: int  # weight rows per program
    block_k: int  # columns per loop step
    num_warps: int
    split_k: int  # programs along K (fp32 partials + _linear_reduce_kernel when > 1)
    num_stages: int  # software-pipelining depth of the K loop


# K is split while the weight-row tiles alone give fewer programs than this (about one per SM of an H200)
MIN_PROGRAMS = 128
MAX_SPLIT_K = 16
REDUCE_BLOCK = 1024


def _next_power_of_2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def gemv_tiles(n: int, k: int, dtype: torch.dtype) -> GemvTiles:
    """The tiles ``linear`` uses for a [n, k] weight. NOTE: never make them depend on the row count T: a row's
    output must not change with the batch it runs in.

    The default (chosen from the compiled sm_90 code, not yet timed: bench/kernels/hot_path.py --linear-only
    sweeps the alternatives on a GPU): 32 weight rows x 512 bytes of columns a step (256 bf16, 128 fp32), 4
    warps, 4 pipeline stages: a 16 KiB weight tile a step and three steps in flight, 72 KiB of shared memory
    with the x tiles, 64 registers a thread (3 programs an SM of an H200; the mma.sync path, which sm_120
    has too). K is split (powers of two, each split a whole number of steps) only while the weight-row tiles
    give fewer than MIN_PROGRAMS programs: the 35B-A3B o_proj and GDN out_proj [2048, 4096] split in 2, its
    router [256, 2048] in 8; no 27B shape is split (N >= 5120: 160 programs or more).
    """
    block_k = min(512 // dtype.itemsize, max(16, _next_power_of_2(k)))
    block_n = min(32, max(16, _next_power_of_2(n)))
    tiles_n = -(-n // block_n)
    split_k = 1
    while tiles_n * split_k < MIN_PROGRAMS and split_k < MAX_SPLIT_K and k % (2 * split_k * block_k) == 0:
        split_k *= 2
    return GemvTiles(block_n, block_k, 4, split_k, 4)


# The weight shapes [N, K] where the GEMV (gemv_tiles' default) beat cuBLAS ``F.linear`` at both T = 1 and T = 8,
# per GPU compute capability: measured on an H200 as CUDA-graph replays over distinct weights
# (bench/results/kernels_linear_h200_2026-12-03_session4.json). Under NINFER_GEMV=auto only these take the GEMV;
# the others (27B qkv [14336, 5120], o_proj / GDN out_proj [5120, 6144], GDN in_proj [16480, 5120]; 35B-A3B qkv
# [9216, 2048]: 0.74-0.93x of cuBLAS) and every GPU not measured yet keep cuBLAS.
GEMV_FASTER: dict[tuple[int, int], frozenset[tuple[int, int]]] = {
    # (the 27B's MLP gate_up / down and lm_head, 1.01-1.08x alone, are left out: in the graphed 27B step they cost
    # 0.07 ms, bench/results/h200_2026-12-04_session9/decode_27b_bf16_gemv_auto.json)
    (9, 0): frozenset(
        {
            (2048, 4096),  # 35B-A3B o_proj / GDN out_proj: 1.13-1.15x
            (12352, 2048),  # 35B-A3B GDN in_proj: 1.06x
            (256, 2048),  # 35B-A3B router: 1.1-1.2x
            (248320, 2048),  # 35B-A3B lm_head: 1.07x
        }
    ),
}


@functools.lru_cache(maxsize=16)
def _capability(device: torch.device) -> tuple[int, int] | None:
    return torch.cuda.get_device_capability(device) if device.type == "cuda" else None


def use_gemv(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether ``linear`` runs the Triton GEMV on these tensors: Triton on their device (``use_triton``), at
    most ``GEMV_MAX_ROWS`` rows, and ``NINFER_GEMV`` ``on``, or ``auto`` with a weight shape that
    ``GEMV_FASTER`` lists for the device's compute capability (``auto`` under Triton's interpreter: every
    shape, so the CPU checks of the kernel run it)."""
    mode = _dispatch.GEMV_MODE
    if mode == "off" or x.shape[0] > GEMV_MAX_ROWS or not use_triton(x, weight):
        return False
    if mode == "on" or _dispatch.INTERPRET:
        return True
    return tuple(weight.shape) in GEMV_FASTER.get(_capability(weight.device) or (0, 0), frozenset())


def _check(x: torch.Tensor, weight: torch.Tensor) -> None:
    assert x.dim() == 2 and weight.dim() == 2, f"x {tuple(x.shape)}, weight {tuple(weight.shape)}: 2-D each"
    assert x.shape[1] == weight.shape[1], f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: K differs"
    assert x.dtype == weight.dtype, f"x {x.dtype} != weight {weight.dtype}"
    assert x.device == weight.device, f"x on {x.device}, weight on {weight.device}"
    assert x.stride(1) == 1 or x.shape[1] <= 1, f"x needs unit stride along K, has strides {x.stride()}"
    assert weight.is_contiguous(), f"weight {tuple(weight.shape)} strides {weight.stride()}: not contiguous"


TICKET_COUNTERS = 4096  # row tiles a split launch can count in (split-K only runs below MIN_PROGRAMS tiles)
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def ticket_counters(device: torch.device) -> torch.Tensor:
    """The device's ``TICKET_COUNTERS`` int32 counters for ``NINFER_SPLITK_REDUCE=last`` (one a row tile, zero
    between launches), made once and kept (a CUDA graph holds their address). NOTE: made at the first GEMV
    launch, before any graph capture (the engine's warm-up runs every layer eagerly first); launches sharing them
    must not run concurrently (the engine runs a model's layers in order on one stream)."""
    counters = _COUNTERS.get(device)
    if counters is None:
        counters = _COUNTERS[device] = torch.zeros(TICKET_COUNTERS, dtype=torch.int32, device=device)
    return counters


def _launch_linear(x: torch.Tensor, weight: torch.Tensor, tiles: GemvTiles) -> torch.Tensor:
    """The Triton GEMV with given tiles (the launcher's choice is ``gemv_tiles``; the bench sweeps others).

    x: [T, K], 1 <= T <= GEMV_MAX_ROWS, unit stride along K (any row stride); weight: [N, K] contiguous.
    """
    _check(x, weight)
    return _gemv(x, weight, tiles)


def _gemv(x: torch.Tensor, weight: torch.Tensor, tiles: GemvTiles) -> torch.Tensor:
    """``_launch_linear`` after ``_check`` (``linear`` has checked already)."""
    rows, k = x.shape
    n = weight.shape[0]
    assert 1 <= rows <= GEMV_MAX_ROWS, f"{rows} rows: the GEMV takes 1..{GEMV_MAX_ROWS}"
    assert min(tiles.block_n, tiles.block_k) >= 16, f"{tiles}: a tensor-core dot needs 16 rows and columns"
    assert tiles.split_k == 1 or k % (tiles.split_k * tiles.block_k) == 0, (
        f"split_k {tiles.split_k} x block_k {tiles.block_k} does not divide K={k} into whole steps"
    )
    out = torch.empty(rows, n, dtype=x.dtype, device=x.device)
    if n == 0:
        return out
    if k == 0:
        return out.zero_()
    target = out
    if tiles.split_k > 1:
        target = torch.empty(tiles.split_k, rows, n, dtype=torch.float32, device=x.device)
    row_tiles = triton.cdiv(n, tiles.block_n)
    last = tiles.split_k > 1 and _dispatch.SPLITK_REDUCE == "last" and row_tiles <= TICKET_COUNTERS
    _linear_gemv_kernel[(row_tiles, tiles.split_k)](
        x, weight, target, ticket_counters(x.device), out, n, rows, x.stride(0), weight.stride(0),
        K_SPLIT=k // tiles.split_k, SPLIT_K=tiles.split_k, LAST_REDUCES=last, BLOCK_N=tiles.block_n,
        BLOCK_K=tiles.block_k, NUM_STAGES=tiles.num_stages, IEEE=x.dtype == torch.float32,
        num_warps=tiles.num_warps,
    )  # fmt: skip
    if tiles.split_k > 1 and not last:
        _linear_reduce_kernel[(triton.cdiv(n, REDUCE_BLOCK), rows)](
            target, out, n, SPLIT_K=tiles.split_k, BLOCK=REDUCE_BLOCK, num_warps=4
        )
    return out


def linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Launcher for ``linear_ref``'s contract, ``x @ weight^T`` (no bias): the Triton GEMV for at most
    ``GEMV_MAX_ROWS`` rows on CUDA (``use_gemv``), ``F.linear`` otherwise (prefill, CPU, ``NINFER_GEMV=off``,
    ``NINFER_KERNELS=ref``).

    x: [T, K], unit stride along K (any row stride); weight: [N, K] contiguous, x's dtype and device ->
    [T, N] (x's dtype).
    """
    _check(x, weight)
    if x.shape[0] == 0 or not use_gemv(x, weight):
        return F.linear(x, weight)
    return _gemv(x, weight, gemv_tiles(weight.shape[0], weight.shape[1], weight.dtype))
