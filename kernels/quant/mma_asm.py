"""The inline PTX of the tensor-core one-row GEMV (``gluon_gemv._quant_gemv_mma_kernel``), as text: no imports, so
the AOT compile tool (bench/kernels/aot_quant.py, a torch-free venv) builds the same kernel the launcher runs."""

from __future__ import annotations


def mma_group_asm(bits: int) -> str:
    """The PTX of one group of Q``bits`` codes (64 lanes: pair planes 2h, 2h + 1 of a unit) of _quant_gemv_mma_kernel, for
    ``gl.inline_asm_elementwise(..., pack=8)``: operands $0-$7 the thread's 8 accumulator elements out (fp32
    bits), $8-$15 them in, $16-$23 plane 2h's pair words as bf16 128 + u (row r words q = 0..3, then row r + 1),
    $24-$31 plane 2h + 1's, $32-$39 the lane-pair words of the quad's row of x (row q of lane 4q + j, zeros past
    the last) of plane 2h at the thread's 4 word columns (twice), $40-$47 plane 2h + 1's, $48-$55 the weight
    rows' group scales (fp32 bits; $48 row r, $52 row r + 1).

    MMA q (q = 0..3) multiplies word q of the quad's 4 threads (16 K lanes: thread j's word 4j + q, both
    planes): A fragment a0/a1 = plane 2h of rows r/r + 1 (fragment rows l/4, l/4 + 8), a2/a3 = plane 2h + 1 (K
    slot j + 4); B fragment b0/b1 = the same lanes of x row q (column q of B). One packed fma makes each pair word
    the codes (exact), the four MMAs sum the group into a fresh C (c0/c1: weight row r times x rows 2j, 2j + 1;
    c2/c3: row r + 1), and one fp32 fma each adds it times the row's group scale to elements 0, 1 (row r) and
    4, 5 (row r + 1); the other 4 elements pass through (still 0.0)."""
    offset = 1 << (bits - 1)  # codes are u - offset
    neg = (0xC300 | offset) * 0x10001  # -(128 + offset) in bf16, twice
    lines = ["{ .reg .b32 one, neg, a0, a1, a2, a3; .reg .f32 c0, c1, c2, c3;", "mov.b32 one, 0x3F803F80;",
             f"mov.b32 neg, {neg:#x};", "mov.f32 c0, 0f00000000;", "mov.f32 c1, 0f00000000;",
             "mov.f32 c2, 0f00000000;", "mov.f32 c3, 0f00000000;"]  # fmt: skip
    for q in range(4):
        lines += [
            f"fma.rn.bf16x2 a0, ${16 + q}, one, neg;",
            f"fma.rn.bf16x2 a1, ${20 + q}, one, neg;",
            f"fma.rn.bf16x2 a2, ${24 + q}, one, neg;",
            f"fma.rn.bf16x2 a3, ${28 + q}, one, neg;",
            "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {c0, c1, c2, c3}, {a0, a1, a2, a3}, "
            f"{{${32 + q}, ${40 + q}}}, {{c0, c1, c2, c3}};",
        ]
    lines += ["fma.rn.f32 $0, c0, $48, $8;", "fma.rn.f32 $1, c1, $48, $9;", "mov.b32 $2, $10;", "mov.b32 $3, $11;",
              "fma.rn.f32 $4, c2, $52, $12;", "fma.rn.f32 $5, c3, $52, $13;", "mov.b32 $6, $14;", "mov.b32 $7, $15; }"]  # fmt: skip
    return " ".join(lines)
