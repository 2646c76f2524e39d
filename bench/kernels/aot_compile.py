"""Compile every Triton kernel in ``kernels/`` ahead of time for GPUs that are not here (sm_120, sm_90).

Proof that the kernels build for the RTX 5090 (sm_120) without one: Triton's compiler needs only the
kernel source, a signature and a ``GPUTarget``; ptxas ships inside the triton wheel, so no GPU, driver
or torch is involved. Runs under the tools venv that ``scripts/setup/40-triton-aot.sh`` builds (the
project's venv has no triton):

    ~/.cache/ninfer-tools/triton-venv/bin/python bench/kernels/aot_compile.py \\
        --json bench/results/triton_aot_sm120_<date>.json

Kernels are found in the source, not by import (the kernel modules import torch): every function in
``kernels/*.py`` decorated with ``triton.jit`` whose name is ``_<op>_kernel``. The jit functions of each
module are copied into a torch-free module of their own and compiled from there. Each kernel needs an
entry in ``VARIANTS`` (the constexpr values and dtypes its launcher uses at the Qwen3.6-27B geometry); a
kernel without one is an error, so a new kernel cannot slip past. ``discover`` and ``VARIANTS`` import
without triton, for tests/kernels/test_aot_sm120.py.
"""

from __future__ import annotations

import argparse
import ast
import datetime
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

REPO = Path(__file__).resolve().parents[2]
KERNELS_DIR = REPO / "kernels"
KERNEL_NAME = re.compile(r"^_\w+_kernel$")
DEFAULT_TARGETS = ("cuda:120", "cuda:90")


@dataclass(frozen=True)
class KernelSource:
    """One @triton.jit function as found in the source."""

    module: str  # e.g. "kernels.norm"
    name: str
    args: tuple[str, ...]
    constexprs: tuple[str, ...]  # the args annotated tl.constexpr
    lineno: int


@dataclass(frozen=True)
class Variant:
    """One launch configuration of a kernel: what its launcher passes at the 27B geometry.

    ptrs: element type of every pointer arg (Triton's names: bf16, fp32, i64, i1, ...); floats: the
    scalar args that are Python floats (fp32); every other non-constexpr arg is an int (i32). Pointers are
    compiled as 16-byte aligned; aligned: the int args that are multiples of 16 at the launch, as Triton's
    JIT specializes them (strides of the real shapes: what enables 16-byte vector and async copies).
    """

    label: str
    ptrs: dict[str, str]
    constexprs: dict[str, int | bool]
    floats: tuple[str, ...] = ()
    aligned: tuple[str, ...] = ()
    num_warps: int = 4
    num_stages: int = 3


def _is_triton_jit(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "jit") or (
        isinstance(target, ast.Name) and target.id == "jit"
    )


def _is_constexpr(annotation: ast.expr | None) -> bool:
    return annotation is not None and ast.unparse(annotation).split(".")[-1] == "constexpr"


def _jit_functions(tree: ast.Module) -> list[ast.FunctionDef]:
    """The jit functions at module level, also inside ``if HAS_TRITON:`` blocks (not inside functions)."""
    found: list[ast.FunctionDef] = []
    pending: list[ast.stmt] = list(tree.body)
    while pending:
        node = pending.pop(0)
        if isinstance(node, ast.FunctionDef) and any(_is_triton_jit(d) for d in node.decorator_list):
            found.append(node)
        elif isinstance(node, ast.If | ast.Try):
            pending.extend(node.body + node.orelse)
    return found


def discover(kernels_dir: Path = KERNELS_DIR) -> list[KernelSource]:
    """Every ``_<op>_kernel`` @triton.jit function in ``kernels_dir/**/*.py``, module order then line order."""
    kernels = []
    for path in sorted(kernels_dir.rglob("*.py")):
        module = ".".join((kernels_dir.name, *path.relative_to(kernels_dir).with_suffix("").parts))
        for fn in _jit_functions(ast.parse(path.read_text(), filename=str(path))):
            if not KERNEL_NAME.match(fn.name):
                continue
            args = tuple(a.arg for a in fn.args.args)
            constexprs = tuple(a.arg for a in fn.args.args if _is_constexpr(a.annotation))
            kernels.append(KernelSource(module, fn.name, args, constexprs, fn.lineno))
    return kernels


# ---------------------------------------------------------------------------------------------------
# What the launchers pass at the Qwen3.6-27B geometry (engine/testing/synthetic.py GEOMETRIES["qwen3.6-27b"]):
# hidden 5120, attention 24 q / 4 kv heads x 256, GDN 16 k / 48 v heads x 128, conv kernel 4, page size 64,
# bf16 activations, weights and caches, fp32 GDN state, int64 slots, bool flags, int32 page tables.

_NORM_PTRS = {p: "bf16" for p in ("x_ptr", "res_ptr", "gate_ptr", "w_ptr", "out_ptr", "sum_ptr")}
# paged_attention_decode: at most DECODE_MAX_SPLITS = 64 splits a sequence (the reduce's BLOCK_S), split unit
# = BLOCK_N = 32 keys at head_dim 256; the int8 cache has 256 / 64 = 4 fp16 scales a head row
_ATTN_SPLITS = 64
_STORE_KV_PTRS = {"key_ptr": "bf16", "value_ptr": "bf16", "slot_mapping_ptr": "i64"}
_DECODE_PTRS = {"q_ptr": "bf16", "page_table_ptr": "i32", "seq_lens_ptr": "i32", "part_out_ptr": "fp32",
                "part_lse_ptr": "fp32"}  # fmt: skip
_PREFILL_PTRS = {"q_ptr": "bf16", "page_table_ptr": "i32", "query_start_loc_ptr": "i32", "seq_lens_ptr": "i32",
                 "out_ptr": "bf16"}  # fmt: skip
_PREFILL_27B = dict(GROUP=6, HEAD_DIM=256, PAGE_SIZE=64, BLOCK_D=256)
_DECODE_27B = dict(NUM_Q_HEADS=24, GROUP=6, HEAD_DIM=256, PAGE_SIZE=64, SPLIT_UNIT=32, MAX_SPLITS=_ATTN_SPLITS,
                   BLOCK_G=16, BLOCK_N=32, BLOCK_D=256)  # fmt: skip

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
            dict(x_ptr="bf16", w_ptr="bf16", out_ptr="fp32" if split > 1 else "bf16"),
            dict(K_SPLIT=k // split, BLOCK_N=32, BLOCK_K=256, NUM_STAGES=4, IEEE=False),
            aligned=("x_stride", "w_stride") if aligned else (),
            num_stages=4,
        )
        for what, k, split, aligned in (
            ("27B K=5120", 5120, 1, True),
            ("27B K=6144", 6144, 1, True),
            ("27B K=17408", 17408, 1, True),
            ("35B-A3B K=2048", 2048, 1, True),
            ("35B-A3B o_proj 2048x4096 split 2", 4096, 2, True),
            ("35B-A3B router 256x2048 split 8", 2048, 8, True),
            ("27B K=6144", 6144, 1, False),  # the fallback Triton compiles for odd strides (no async copies)
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
                x_ptr="bf16", w_ptr="bf16", states_ptr="bf16", slots_ptr="i64", keep_ptr="i1", out_ptr="bf16"
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
            dict(_DECODE_27B, KV_INT8=False, NUM_SCALES=1, BLOCK_SCALES=1),
            floats=("scale_log2",),
        ),
        Variant(
            "Hq=24 Hkv=4 D=256 page 64 int8 g64",
            {
                **_DECODE_PTRS,
                "key_cache_ptr": "i8",
                "value_cache_ptr": "i8",
                "key_scale_ptr": "fp16",
                "value_scale_ptr": "fp16",
            },
            dict(_DECODE_27B, KV_INT8=True, NUM_SCALES=4, BLOCK_SCALES=4),
            floats=("scale_log2",),
        ),
    ],
    # reduce: BLOCK_S = next_pow2(max_splits), BLOCK_D = min(64, next_pow2(head_dim))
    "_paged_attention_reduce_kernel": [
        Variant(
            f"Hq=24 D=256 {_ATTN_SPLITS} splits",
            dict(part_out_ptr="fp32", part_lse_ptr="fp32", seq_lens_ptr="i32", out_ptr="bf16"),
            dict(
                NUM_Q_HEADS=24,
                HEAD_DIM=256,
                SPLIT_UNIT=32,
                MAX_SPLITS=_ATTN_SPLITS,
                BLOCK_S=_ATTN_SPLITS,
                BLOCK_D=64,
            ),
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
    # moe_route: BLOCK_E = next_pow2(E), BLOCK_TOPK = next_pow2(top_k)
    "_moe_route_kernel": [
        Variant(
            "E=256 top_k=8",
            dict(logits_ptr="bf16", weights_ptr="fp32", ids_ptr="i64"),
            dict(TOP_K=8, BLOCK_TOPK=8, BLOCK_E=256, RENORMALIZE=True),
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
}


def _quant_variants() -> dict[str, list[Variant]]:
    """The kernels/quant/ launch values, kept in bench/kernels/aot_quant.py (this file is long enough)."""
    spec = importlib.util.spec_from_file_location(
        "ninfer_aot_quant", Path(__file__).with_name("aot_quant.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    variants: dict[str, list[Variant]] = module.variants(Variant)
    return variants


VARIANTS.update(_quant_variants())


def signature(kernel: KernelSource, variant: Variant) -> tuple[dict[str, str], dict[str, int | bool]]:
    """(Triton signature {arg: type}, constexprs {arg: value}) for one variant; raises on a mismatch."""
    missing = set(kernel.constexprs) - set(variant.constexprs)
    extra = set(variant.constexprs) - set(kernel.constexprs)
    if missing or extra:
        raise ValueError(
            f"{kernel.name} [{variant.label}]: constexprs missing {missing or '{}'}, unknown {extra or '{}'}"
        )
    pointers = {a for a in kernel.args if a.endswith("_ptr")}
    if pointers != set(variant.ptrs):
        raise ValueError(
            f"{kernel.name} [{variant.label}]: pointer args {sorted(pointers)} != {sorted(variant.ptrs)}"
        )
    ints = set(kernel.args) - pointers - set(kernel.constexprs) - set(variant.floats)
    if not set(variant.aligned) <= ints:
        raise ValueError(
            f"{kernel.name} [{variant.label}]: aligned {sorted(set(variant.aligned) - ints)}: no int args"
        )
    sig: dict[str, str] = {}
    for arg in kernel.args:
        if arg in variant.constexprs:
            sig[arg] = "constexpr"
        elif arg in variant.ptrs:
            sig[arg] = "*" + variant.ptrs[arg]
        else:
            sig[arg] = "fp32" if arg in variant.floats else "i32"
    return sig, dict(variant.constexprs)


# ---------------------------------------------------------------------------------------------------
# Compiling (needs triton: the tools venv)


def _torch_free_module(path: Path, out_dir: Path) -> ModuleType:
    """The jit functions of one kernels/ module, copied into a module that imports only triton. A module of a
    kernel package (kernels/attention/decode.py) brings its siblings' jit functions too: its kernels call the
    helpers they share (kernels/attention/int8.py's ``_dequantize_tile``)."""
    siblings = [] if path.parent.name == KERNELS_DIR.name else sorted(set(path.parent.glob("*.py")) - {path})
    chunks = ["import triton\nimport triton.language as tl\n"]
    for file in (path, *siblings):
        source = file.read_text()
        lines = source.splitlines()
        for fn in _jit_functions(ast.parse(source)):
            first = min([fn.lineno, *(d.lineno for d in fn.decorator_list)])
            assert fn.end_lineno is not None
            chunks.append(textwrap.dedent("\n".join(lines[first - 1 : fn.end_lineno])))
    name = "aot_" + "_".join(path.with_suffix("").parts[-2:])
    out = out_dir / f"{name}.py"
    out.write_text("\n\n".join(chunks) + "\n")
    spec = importlib.util.spec_from_file_location(name, out)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # inspect.getsource (used by triton.jit) looks modules up here
    spec.loader.exec_module(module)
    return module


def _resource_usage(cuobjdump: str, cubin: bytes, work: Path) -> dict[str, Any]:
    """cuobjdump's per-function resource usage (REG, STACK, SHARED, LOCAL) and the ELF's arch."""
    path = work / "kernel.cubin"
    path.write_bytes(cubin)
    usage = subprocess.run(
        [cuobjdump, "--dump-resource-usage", str(path)], capture_output=True, text=True, check=True
    ).stdout
    found = dict(re.findall(r"\b(REG|STACK|SHARED|LOCAL):(\d+)", usage))
    elf = subprocess.run(
        [cuobjdump, "--dump-elf", str(path)], capture_output=True, text=True, check=False
    ).stdout
    arch = re.search(r"\bsm_\d+[af]?\b", elf)
    return {
        "registers": int(found["REG"]) if "REG" in found else None,
        "stack_bytes": int(found["STACK"]) if "STACK" in found else None,
        "static_shared_bytes": int(found["SHARED"]) if "SHARED" in found else None,
        "local_bytes": int(found["LOCAL"]) if "LOCAL" in found else None,
        "elf_arch": arch.group(0) if arch else None,
    }


def _ptx_target(ptx: str) -> str | None:
    found = re.search(r"^\s*\.target\s+(\w+)", ptx, re.MULTILINE)
    return found.group(1) if found else None


def compile_all(
    targets: tuple[str, ...] = DEFAULT_TARGETS, kernels_dir: Path = KERNELS_DIR
) -> dict[str, Any]:
    """Compile every discovered kernel's every variant for every target; a report with one row each."""
    import triton
    import triton.backends.nvidia.compiler as nvidia
    from triton.backends.compiler import GPUTarget

    kernels = discover(kernels_dir)
    unspecified = [k.name for k in kernels if k.name not in VARIANTS]
    if unspecified:
        raise SystemExit(
            f"no AOT variants for {unspecified}: add their launch values to VARIANTS in {__file__}"
        )
    cuobjdump = nvidia.knobs.nvidia.cuobjdump.path
    rows: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="ninfer-aot-") as tmp:
        work = Path(tmp)
        modules: dict[str, ModuleType] = {}
        for kernel in kernels:
            if kernel.module not in modules:
                path = kernels_dir.joinpath(*kernel.module.split(".")[1:]).with_suffix(".py")
                modules[kernel.module] = _torch_free_module(path, work)
            fn = getattr(modules[kernel.module], kernel.name)
            for variant in VARIANTS[kernel.name]:
                sig, constexprs = signature(kernel, variant)
                attrs = {
                    (i,): [["tt.divisibility", 16]]
                    for i, a in enumerate(kernel.args)
                    if a in variant.ptrs or a in variant.aligned
                }
                for target in targets:
                    backend, arch = target.split(":")
                    row: dict[str, Any] = {
                        "kernel": kernel.name, "module": kernel.module, "variant": variant.label,
                        "target": target, "num_warps": variant.num_warps, "num_stages": variant.num_stages,
                    }  # fmt: skip
                    start = time.perf_counter()
                    try:
                        src = triton.compiler.ASTSource(
                            fn=fn, signature=sig, constexprs=constexprs, attrs=attrs
                        )
                        compiled = triton.compile(
                            src,
                            target=GPUTarget(backend, int(arch), 32),
                            options={"num_warps": variant.num_warps, "num_stages": variant.num_stages},
                        )
                    except Exception as exc:  # noqa: BLE001  (recorded per row; the caller fails on it)
                        row.update(ok=False, error=f"{type(exc).__name__}: {exc}"[-4000:])
                        rows.append(row)
                        continue
                    cubin = compiled.asm.get("cubin", b"")
                    meta = compiled.metadata
                    row.update(
                        ok=bool(cubin),
                        compile_s=round(time.perf_counter() - start, 3),
                        cubin_bytes=len(cubin),
                        ptx_target=_ptx_target(compiled.asm.get("ptx", "")),
                        triton_shared_bytes=meta.shared,
                        **(_resource_usage(cuobjdump, cubin, work) if cubin else {}),
                    )
                    rows.append(row)
    return {
        "what": "Triton ahead-of-time compile of every kernels/ @triton.jit kernel, 27B launch values",
        "date": datetime.date.today().isoformat(),
        "triton": triton.__version__,
        "ptxas": {  # the wheel's two: ptxas-blackwell for arch >= 100, ptxas below
            t: nvidia.get_ptxas(int(t.split(":")[1])).path.rsplit("/", 1)[-1]
            + " "
            + nvidia.get_ptxas_version(int(t.split(":")[1])).strip().splitlines()[-1]
            for t in targets
        },
        "commit": _commit(),
        "targets": list(targets),
        "kernels": [k.name for k in kernels],
        "ok": all(r["ok"] for r in rows),
        "rows": rows,
    }


def _commit() -> str:
    head = subprocess.run(
        ["git", "-C", str(REPO), "rev-parse", "HEAD"], capture_output=True, text=True, check=False
    )
    dirty = subprocess.run(
        ["git", "-C", str(REPO), "status", "--porcelain", "--", "kernels"],
        capture_output=True,
        text=True,
        check=False,
    )
    commit = head.stdout.strip() or "unknown"
    return commit + (" (+ uncommitted changes)" if dirty.stdout.strip() else "")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, required=True, help="where to write the report")
    p.add_argument("--target", action="append", help="backend:arch, repeatable (default cuda:120, cuda:90)")
    p.add_argument("--kernels-dir", type=Path, default=KERNELS_DIR)
    args = p.parse_args(argv)
    report = compile_all(tuple(args.target or DEFAULT_TARGETS), args.kernels_dir)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for row in report["rows"]:
        status = f"{row['cubin_bytes']:>7} B cubin, {row.get('registers')} regs" if row["ok"] else "FAILED"
        print(f"{row['target']:<9} {row['kernel']:<32} {row['variant']:<30} {status}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
