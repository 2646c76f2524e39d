"""The GEMV layout's launch tiles (``kernels.quant.packed_linear.packed_tiles``): K splits are whole steps of
whole units, the default avoids a grid of barely more than one wave of resident programs, and the bench's
variants and the shape table resolve. Pure Python, CPU."""

from __future__ import annotations

import pytest

from kernels.quant import Q4, Q5, Q6, W8
from kernels.quant.packed_linear import GEMV_TABLE, GEMV_VARIANTS, RESIDENT, packed_tiles

# the 27B's projections (fused parents) and the 35B-A3B's W8 o_proj
SHAPES = [(Q4, 7168, 5120), (Q5, 7168, 5120), (Q5, 5120, 6144), (Q4, 4096, 5120), (Q5, 12288, 5120),
          (Q4, 34816, 5120), (Q5, 5120, 17408), (Q6, 248320, 5120), (W8, 2048, 4096)]  # fmt: skip


@pytest.mark.parametrize("variant", list(GEMV_VARIANTS))
@pytest.mark.parametrize(("fmt", "n", "k"), SHAPES)
def test_splits_are_whole_steps(fmt, n, k, variant):
    tiles = packed_tiles(fmt, n, k, variant)
    units = k // 128
    assert units % (tiles.split_k * tiles.step_units) == 0, tiles
    assert tiles.block_n >= 16 and tiles.mode in ("dot", "fma", "pairs", "mma", "ring", "mma_ring")
    if fmt == W8 and tiles.mode in (
        "pairs",
        "mma",
        "ring",
        "mma_ring",
    ):  # W8's Gluon kernel walks one unit a step
        assert tiles.step_units == 1
    if tiles.mode in ("mma", "mma_ring"):  # the MMA kernels' layout: 16 rows a warp
        assert tiles.block_n % (16 * tiles.num_warps) == 0


@pytest.mark.parametrize(("fmt", "n", "k"), SHAPES)
def test_one_row_takes_the_one_row_kernel(fmt, n, k):
    """Decode at C=1 runs the Gluon one-row kernel (Q4/Q5/Q6 on pair words; W8 the Triton CUDA-core mode (its Gluon
    kernel was no faster end to end): the "pairs" variants reach it); 2..8 rows share one set of tiles (batch
    invariance among them): the tensor-core Gluon kernel for Q4/Q5/Q6, the Triton GEMV for W8."""
    assert packed_tiles(fmt, n, k, rows=1).mode == ("fma" if fmt == W8 else "pairs")
    if fmt == W8:
        assert packed_tiles(fmt, n, k, "pairs", rows=1).mode == "pairs"
    batched = {packed_tiles(fmt, n, k, rows=t) for t in range(2, 9)}
    assert len(batched) == 1 and batched.pop().mode == ("dot" if fmt == W8 else "mma")


@pytest.mark.parametrize(("fmt", "n", "k"), SHAPES)
def test_default_grid_is_not_a_sliver_past_a_wave(fmt, n, k):
    tiles = packed_tiles(fmt, n, k, sms=132)
    slots = 132 * RESIDENT[{Q4: 4, Q5: 5, Q6: 6, W8: 8}[fmt]]
    programs = -(-n // tiles.block_n) * tiles.split_k
    waves = programs / slots
    assert waves <= 1 or waves - int(waves) == 0 or waves >= 2, f"{tiles}: {programs} programs on {slots}"


def test_q4_query_key_takes_one_full_wave():
    # 56 row tiles x 40 units on 132 SMs x 4 programs: split 8 (448 programs, one wave), not 10 (560: two)
    assert packed_tiles(Q4, 7168, 5120, sms=132).split_k == 8


def test_table_entries_name_variants():
    assert all(name in GEMV_VARIANTS for name in GEMV_TABLE.values())


@pytest.mark.parametrize(("fmt", "n", "k"), [s for s in SHAPES if s[0] != W8])
def test_ring_tiles_fill_the_resident_slots(fmt, n, k):
    """The ring kernel's K split counts its own resident programs an SM (RING_RESIDENT: more than the pairs
    kernel's, its bytes in flight live in shared memory, not registers), so its grid is whole waves of them: no
    split K that leaves a wave barely started, and never fewer programs than the pairs kernel's table allows."""
    from kernels.quant.packed_linear import H200_SMS, RING_RESIDENT, _wave_split

    for name in ("ring_n64s2", "ring_n32w2s2"):
        tiles = packed_tiles(fmt, n, k, name)
        key = (
            "ring",
            int(fmt[1]),
            tiles.block_n,
            tiles.num_warps,
            tiles.step_units,
            GEMV_VARIANTS[name].num_stages,
        )
        slots = H200_SMS * RING_RESIDENT.get(key, 4)
        tiles_n = -(-n // tiles.block_n)
        assert tiles.split_k == _wave_split(k // 128, tiles.step_units, tiles_n, slots), (name, tiles)
        assert tiles.mode == "ring" and tiles.num_stages == GEMV_VARIANTS[name].num_stages
