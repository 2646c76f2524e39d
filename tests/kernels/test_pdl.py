"""NINFER_PDL (kernels/pdl.py): the switch's parsing, when a launch gets ``launch_pdl`` (never under Triton's
interpreter, on a CPU tensor or below sm_90), the source guard against the race (every kernel launched with PDL
waits before it touches a predecessor's data), and, marked ``gpu``, PDL on against off bitwise for the GEMV, its
split-K reduce, the norms and the activation (on the device those launches really are programmatic)."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import kernels._dispatch
import kernels.pdl
from engine import env
from kernels.pdl import pdl_args, pdl_enabled

REPO = Path(__file__).resolve().parents[2]
KERNELS = REPO / "kernels"
# the only calls a PDL kernel may make before pdl_wait that touch memory: L2 prefetches of its WEIGHTS
PREFETCH_HELPERS = {"pdl_prefetch_l2", "gemv_prefetch_weights"}
# jit helpers that read only WEIGHTS (their pointer arguments are model parameters), allowed before the wait in these
# kernels alone: the quantized GEMVs load their split's first step of planes (codes, high bits, scales) there
WEIGHT_LOADS_BEFORE_WAIT = {
    "_quant_gemv_packed_kernel": {"_packed_load"},
    "_quant_gemv_pairs_kernel": {"_pairs_load"},  # the Gluon one-row GEMVs (kernels/quant/gluon_gemv.py)
    "_quant_gemv_mma_kernel": {"_pairs_load"},
    "_quant_gemv_w8_pairs_kernel": {"_weight_step_load"},
    "_quant_gemv_fp8_rows_kernel": {"_weight_step_load"},
    "_quant_gemv_nvfp4_rows_kernel": {"_weight_step_load"},
}
WEIGHT_POINTERS = {"codes_ptr", "high_ptr", "scales_ptr"}
MEMORY_CALLS = {"load", "store", "atomic_add", "atomic_cas", "atomic_xchg", "atomic_max", "atomic_min"}


def test_switch_is_normalised_refused_and_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (
        kernels._dispatch.parse_pdl_mode(" ON ") == "on" and kernels._dispatch.parse_pdl_mode("off") == "off"
    )
    with pytest.raises(ValueError, match=r"^NINFER_PDL='1': expected 'off', 'on'$"):
        kernels._dispatch.parse_pdl_mode("1")
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "on")
    assert env.pdl_mode() == "on"


def test_launch_keywords(monkeypatch: pytest.MonkeyPatch) -> None:
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(kernels.pdl, "HAS_TRITON", True)
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", False)
    monkeypatch.setattr(kernels.pdl, "_capable", lambda device: True)
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "off")
    assert dict(pdl_args(cuda)) == {"PDL": False}  # off: the kernels' default build, no launch attribute
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "on")
    assert dict(pdl_args(cuda)) == {"PDL": True, "launch_pdl": True}
    assert dict(pdl_args(torch.device("cpu"))) == {"PDL": False}  # a CPU tensor never launches with PDL
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", True)  # Triton's interpreter cannot run inline PTX
    assert dict(pdl_args(cuda)) == {"PDL": False} and not pdl_enabled(cuda)
    monkeypatch.setattr(kernels._dispatch, "INTERPRET", False)
    monkeypatch.setattr(kernels.pdl, "_capable", lambda device: False)  # below sm_90: no PDL
    assert dict(pdl_args(cuda)) == {"PDL": False}


def test_on_changes_nothing_on_the_cpu() -> None:
    # a fresh interpreter reading NINFER_PDL=on at import: the CPU path (torch references) is what it was
    code = (
        "import torch\nfrom kernels import _dispatch\nfrom kernels.linear import linear, linear_ref\n"
        "from kernels.norm import rms_norm, rms_norm_ref\nfrom kernels.pdl import pdl_args\n"
        "assert _dispatch.PDL_MODE == 'on'\nassert dict(pdl_args(torch.device('cpu'))) == {'PDL': False}\n"
        "x, w = torch.randn(3, 40), torch.randn(24, 40)\nassert torch.equal(linear(x, w), torch.nn.functional.linear(x, w))\n"
        "n = torch.randn(40)\nassert torch.equal(rms_norm(x, n, 1e-6), rms_norm_ref(x, n, 1e-6))\nprint('ok')\n"
    )
    environ = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"} | {"NINFER_PDL": "on"}
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, env=environ, capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-3000:]


# ---------------------------------------------------------------------------------------------------------------
# The source guard: every kernel a launcher passes pdl_args to waits before it reads or writes dependent data


def _name(func: ast.expr) -> str:
    return func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""


def _pdl_launches(tree: ast.Module) -> set[str]:
    """Kernels launched as ``kernel[grid](..., **pdl_args(...))`` in a module."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript):
            if any(kw.arg is None and isinstance(kw.value, ast.Call) and _name(kw.value.func) == "pdl_args"
                   for kw in node.keywords):  # fmt: skip
                found.add(_name(node.func.value))
    return found


def _all_launches(tree: ast.Module) -> dict[str, list[bool]]:
    """Every ``name[grid](...)`` launch: kernel name -> whether each passes pdl_args."""
    found: dict[str, list[bool]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript) and _name(node.func.value):
            passes = any(kw.arg is None and isinstance(kw.value, ast.Call) and _name(kw.value.func) == "pdl_args"
                         for kw in node.keywords)  # fmt: skip
            found.setdefault(_name(node.func.value), []).append(passes)
    return found


def _jit_functions(tree: ast.Module) -> dict[str, ast.FunctionDef]:
    return {
        node.name: node
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list)
    }


def _touches_memory(name: str, jit: dict[str, ast.FunctionDef], seen: frozenset[str] = frozenset()) -> bool:
    """Whether jit function ``name`` loads, stores or runs an atomic, itself or through a jit function it calls (a
    call of a pure helper, index arithmetic, may come before the wait)."""
    for node in ast.walk(jit[name]):
        if isinstance(node, ast.Call):
            called = _name(node.func)
            if called in MEMORY_CALLS:
                return True
            if called in jit and called not in seen | {name} and _touches_memory(called, jit, seen | {name}):
                return True
    return False


def pdl_violations(
    sources: list[str], weight_loads: dict[str, set[str]] = WEIGHT_LOADS_BEFORE_WAIT
) -> list[str]:
    """What breaks kernels/pdl.py's rule in these module sources: a kernel launched with pdl_args that has no
    ``PDL: tl.constexpr``, no top-level ``pdl_wait(PDL)``, or, before that wait, a load, store, atomic or call of
    another jit function that touches memory (only the weight-prefetch helpers and, in the kernels of
    ``weight_loads`` (kernel -> helpers), their weight-load helpers given weight pointers alone may come first); a launch of
    a PDL kernel without pdl_args; a prefetch helper that touches memory otherwise."""
    trees = [ast.parse(s) for s in sources]
    jit: dict[str, ast.FunctionDef] = {}
    launched: set[str] = set()
    launches: dict[str, list[bool]] = {}
    for tree in trees:
        jit.update(_jit_functions(tree))
        launched |= _pdl_launches(tree)
        for name, passes in _all_launches(tree).items():
            launches.setdefault(name, []).extend(passes)
    problems = []
    for name in sorted(launched):
        fn = jit.get(name)
        if fn is None:
            problems.append(f"{name}: launched with pdl_args, no @triton.jit source found")
            continue
        if not any(a.arg == "PDL" and a.annotation is not None and "constexpr" in ast.unparse(a.annotation)
                   for a in fn.args.args):  # fmt: skip
            problems.append(f"{name}: no `PDL: tl.constexpr` argument")
        waits = [i for i, stmt in enumerate(fn.body) if ast.unparse(stmt).strip() == "pdl_wait(PDL)"]
        if not waits:
            problems.append(f"{name}: no top-level pdl_wait(PDL)")
            continue
        for stmt in fn.body[: waits[0]]:
            for node in ast.walk(stmt):
                if isinstance(node, ast.Call):
                    called = _name(node.func)
                    allowed = PREFETCH_HELPERS | weight_loads.get(name, set())
                    if called in MEMORY_CALLS or (
                        called in jit and called not in allowed and _touches_memory(called, jit)
                    ):
                        problems.append(f"{name}: {called}() before pdl_wait(PDL), line {node.lineno}")
    for name, passes in sorted(launches.items()):
        fn = jit.get(name)
        if fn is not None and any(a.arg == "PDL" for a in fn.args.args) and not all(passes):
            problems.append(f"{name}: has a PDL argument but a launch without pdl_args")
    for name, helpers in weight_loads.items():
        for node in ast.walk(jit[name]) if name in jit else ():
            if isinstance(node, ast.Call) and _name(node.func) in helpers:
                names = {n.id for a in node.args for n in ast.walk(a) if isinstance(n, ast.Name)}
                pointers = {n for n in names if "ptr" in n}  # x_ptr, a pointer tensor such as w_ptrs, ...
                if not pointers <= WEIGHT_POINTERS:
                    problems.append(f"{name}: {_name(node.func)}() reads {sorted(pointers)}: weights only")
    for helper in PREFETCH_HELPERS & set(jit):
        for node in ast.walk(jit[helper]):
            if isinstance(node, ast.Call) and _name(node.func) in MEMORY_CALLS:
                problems.append(f"{helper}: a prefetch helper calls {_name(node.func)}()")
    return problems


def test_every_pdl_kernel_waits_before_touching_dependent_data() -> None:
    sources = [p.read_text() for p in sorted(KERNELS.rglob("*.py"))]
    launched = set().union(*(_pdl_launches(ast.parse(s)) for s in sources))
    # the decode hot path this switch covers
    assert {"_linear_gemv_kernel", "_linear_reduce_kernel", "_rms_norm_kernel", "_silu_mul_kernel",
            "_gated_delta_rule_decode_kernel", "_store_kv_kernel", "_moe_down_kernel"} <= launched  # fmt: skip
    # session 12: decode attention and its reduce, the fused attention prologue, the quantized MoE experts (v1, v2)
    # and group GEMV, the Gluon GEMVs
    assert {"_paged_attention_decode_kernel", "_paged_attention_decode_int8_kernel",
            "_paged_attention_decode_int8_km_kernel", "_paged_attention_reduce_kernel", "_qk_norm_rope_store_kernel",
            "_quant_moe_gate_up_kernel", "_quant_moe_down_kernel", "_quant_moe_gate_up_v2_kernel",
            "_quant_moe_down_v2_kernel", "_quant_gemv_group_kernel", *WEIGHT_LOADS_BEFORE_WAIT} <= launched  # fmt: skip
    assert pdl_violations(sources) == []


def test_the_guard_catches_a_read_before_the_wait() -> None:
    head = "import triton\nimport triton.language as tl\n\n@triton.jit\n"
    good = head + (
        "def _k(x_ptr, w_ptr, PDL: tl.constexpr):\n    pdl_prefetch_l2(w_ptr, PDL)\n    pdl_wait(PDL)\n"
        "    tl.store(x_ptr, tl.load(x_ptr))\n\ndef launch(x):\n    _k[(1,)](x, x, **pdl_args(x.device))\n"
    )
    assert pdl_violations([good]) == []
    early = good.replace("    pdl_prefetch_l2(w_ptr, PDL)\n", "    v = tl.load(x_ptr)\n")
    assert pdl_violations([early]) == ["_k: load() before pdl_wait(PDL), line 6"]
    assert pdl_violations([good.replace("    pdl_wait(PDL)\n", "")]) == ["_k: no top-level pdl_wait(PDL)"]
    no_flag = good.replace(", PDL: tl.constexpr", "")
    assert pdl_violations([no_flag]) == ["_k: no `PDL: tl.constexpr` argument"]
    bare = good + "\ndef other(x):\n    _k[(1,)](x, x, PDL=False)\n"
    assert pdl_violations([bare]) == ["_k: has a PDL argument but a launch without pdl_args"]


def test_the_guard_allows_pure_helpers_and_weight_loads_alone_before_the_wait() -> None:
    head = "import triton\nimport triton.language as tl\n\n@triton.jit\n"
    helpers = head + (
        "def _rows(n):\n    return tl.arange(0, 16) % n\n\n@triton.jit\n"
        "def _step_load(w_ptr, offs):\n    return tl.load(w_ptr + offs)\n\n@triton.jit\n"
        "def _deep(x_ptr, offs):\n    return _step_load(x_ptr, offs)\n\n@triton.jit\n"
    )
    kernel = (
        "def _k(x_ptr, codes_ptr, N, PDL: tl.constexpr):\n    r = _rows(N)\n    w = _step_load(codes_ptr, r)\n"
        "    pdl_wait(PDL)\n    tl.store(x_ptr + r, w + tl.load(x_ptr + r))\n\n"
        "def launch(x, w):\n    _k[(1,)](x, w, 16, **pdl_args(x.device))\n"
    )
    loads = {"_k": {"_step_load"}}
    assert pdl_violations([helpers + kernel], loads) == []  # a pure helper, then a weight load: fine
    not_listed = pdl_violations([helpers + kernel])  # the same kernel without its weight-load helper listed
    assert not_listed == ["_k: _step_load() before pdl_wait(PDL), line 19"]
    x_first = kernel.replace("_step_load(codes_ptr, r)", "_step_load(x_ptr + 0, r)")
    assert pdl_violations([helpers + x_first], loads) == ["_k: _step_load() reads ['x_ptr']: weights only"]
    deep = kernel.replace("_step_load(codes_ptr, r)", "_deep(x_ptr, r)")  # a load two helpers down
    assert pdl_violations([helpers + deep], loads) == ["_k: _deep() before pdl_wait(PDL), line 19"]


# ---------------------------------------------------------------------------------------------------------------
# GPU (or CPU under TRITON_INTERPRET=1, where PDL stays off): on against off, bitwise


def _twice(monkeypatch: pytest.MonkeyPatch, fn):
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "off")
    off = fn()
    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "on")
    on = fn()
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    return off, on


@pytest.mark.gpu
@pytest.mark.usefixtures("interpreter_fixes")
@pytest.mark.parametrize(
    ("n", "k", "reduce"), [(96, 256, "launch"), (40, 2048, "launch"), (40, 2048, "last")]
)
def test_gemv_with_pdl_is_bitwise_the_gemv_without(
    monkeypatch: pytest.MonkeyPatch, device: str, n: int, k: int, reduce: str
) -> None:
    from kernels.linear import linear

    monkeypatch.setattr(kernels._dispatch, "GEMV_MODE", "on")
    monkeypatch.setattr(kernels._dispatch, "SPLITK_REDUCE", reduce)
    x = torch.randn(3, k, device=device, dtype=torch.bfloat16)
    w = torch.randn(n, k, device=device, dtype=torch.bfloat16)
    off, on = _twice(monkeypatch, lambda: linear(x, w))
    assert torch.equal(off, on)
    if device == "cuda" and torch.cuda.get_device_capability()[0] >= 9:
        assert pdl_enabled(x.device)  # the "on" run really launched with PDL


@pytest.mark.gpu
def test_norm_and_activation_with_pdl_are_bitwise_without(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    from kernels.activation import silu_mul
    from kernels.norm import add_rms_norm

    x, res = (torch.randn(5, 320, device=device, dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(320, device=device, dtype=torch.bfloat16)
    off, on = _twice(monkeypatch, lambda: (*add_rms_norm(x, res, w, 1e-6), silu_mul(x, res)))
    assert all(torch.equal(a, b) for a, b in zip(off, on, strict=True))


@pytest.mark.gpu
def test_the_interpreter_never_gets_launch_pdl(monkeypatch: pytest.MonkeyPatch, device: str) -> None:
    if device != "cpu":
        pytest.skip("a check of Triton's interpreter (TRITON_INTERPRET=1)")
    import kernels.norm

    seen: list[dict] = []

    class Recorder:
        def __getitem__(self, grid):
            return lambda *args, **kwargs: seen.append(kwargs)

    monkeypatch.setattr(kernels._dispatch, "PDL_MODE", "on")
    monkeypatch.setattr(kernels.norm, "_rms_norm_kernel", Recorder())
    kernels.norm.rms_norm(torch.randn(2, 64), torch.randn(64), 1e-6)
    assert len(seen) == 1 and seen[0]["PDL"] is False and "launch_pdl" not in seen[0]


# The kernels session 12 converted: decode attention (bf16, int8 grouped and keys-major) with its reduce and the gate
# fused into it, the fused attention prologue, the quantized MoE experts (v1, v2) and the quantized GEMVs (the Gluon
# one-row and few-row kernels on a GPU, whose first weight step is loaded before the wait; under the interpreter the
# Triton GEMVs), each PDL on against off, bitwise


def _on_gpu_with_pdl(device: str) -> bool:
    return device == "cuda" and torch.cuda.get_device_capability()[0] >= 9


@pytest.mark.gpu
@pytest.mark.parametrize("kv", ["bf16", "int8_grouped", "int8_keys_major"])
def test_decode_attention_with_pdl_is_bitwise_without(
    monkeypatch: pytest.MonkeyPatch, device: str, kv: str
) -> None:
    from test_attention_triton import _cache_and_table

    from kernels.attention.decode import paged_attention_decode

    key_cache, value_cache, page_table, lens, key_scale, value_scale = _cache_and_table(
        [70, 9, 1], 2, 64, 16, 5, device, int8=kv != "bf16"
    )
    query, gate = (torch.randn(3, 6, 64, device=device, dtype=torch.bfloat16) for _ in "qg")
    args = (query, key_cache, value_cache, page_table, lens, 0.125, key_scale, value_scale, gate)
    keys_major = kv == "int8_keys_major"
    off, on = _twice(
        monkeypatch,
        lambda: paged_attention_decode(*args, fused=True, block_n=16, int8_keys_major=keys_major),
    )
    assert torch.equal(off, on)
    if _on_gpu_with_pdl(device):
        assert pdl_enabled(query.device)


@pytest.mark.gpu
def test_fused_attention_prologue_with_pdl_is_bitwise_without(
    monkeypatch: pytest.MonkeyPatch, device: str
) -> None:
    from kernels.attention.fuse import qk_norm_rope_store

    tokens, heads, kv_heads, dim, rotary = 3, 6, 2, 64, 32
    query = torch.randn(tokens, heads, dim, device=device, dtype=torch.bfloat16)
    key, value = (torch.randn(tokens, kv_heads, dim, device=device, dtype=torch.bfloat16) for _ in "kv")
    q_w, k_w = (torch.randn(dim, device=device, dtype=torch.bfloat16) * 0.1 for _ in "qk")
    cos, sin = (torch.randn(tokens, rotary, device=device, dtype=torch.bfloat16) for _ in "cs")
    slots = torch.tensor([5, -1, 17], device=device)

    def run() -> tuple[torch.Tensor, ...]:
        caches = [torch.zeros(4, 8, kv_heads, dim, device=device, dtype=torch.bfloat16) for _ in "kv"]
        q = qk_norm_rope_store(query, key, value, q_w, k_w, 1e-6, cos, sin, *caches, slots, fused=True)
        return q, *caches

    off, on = _twice(monkeypatch, run)
    assert all(torch.equal(a, b) for a, b in zip(off, on, strict=True))


@pytest.mark.gpu
@pytest.mark.parametrize("version", ["v1", "v2"])
def test_quant_moe_with_pdl_is_bitwise_without(
    monkeypatch: pytest.MonkeyPatch, device: str, version: str
) -> None:
    from test_quant_moe import TOP_K, E, H, make_experts

    from kernels.moe import moe_route_ref
    from kernels.quant import Q4, Q5
    from kernels.quant.quant_moe import quant_moe_experts

    gate_up, down, _, _ = make_experts(Q4, Q5, device)
    x = torch.randn(3, H, device=device).bfloat16()
    weights, ids = moe_route_ref(torch.randn(3, E, device=device), TOP_K)
    off, on = _twice(monkeypatch, lambda: quant_moe_experts(x, gate_up, down, weights, ids, version=version))
    assert torch.equal(off, on)


@pytest.mark.gpu
@pytest.mark.usefixtures("interpreter_fixes")
@pytest.mark.parametrize(
    ("fmt", "rows", "layout"),
    [("Q4G64_F16S", 1, "gemv"), ("Q6G64_F16S", 1, "gemv"), ("Q5G64_F16S", 4, "gemv"), ("W8G32_F16S", 1, "gemv"),
     ("Q4G64_F16S", 1, "stored"), ("FP8_E4M3FN_ROW_BF16S", 1, "stored"), ("NVFP4", 1, "stored")],
)  # fmt: skip
def test_quant_gemv_with_pdl_is_bitwise_without(
    monkeypatch: pytest.MonkeyPatch, device: str, fmt: str, rows: int, layout: str
) -> None:
    # on a GPU: the GEMV layout's one row of Q4 / Q6 runs _quant_gemv_pairs_kernel, 4 rows of Q5
    # _quant_gemv_mma_kernel, W8 (its Gluon tiles) _quant_gemv_w8_pairs_kernel; stored FP8 / NVFP4 one row the Gluon
    # rows kernels, stored Q4 the group GEMV (kernels/quant/triton_group.py); K = 2048 splits, so the reduce runs too.
    # Under the interpreter: the Triton GEMVs (no Gluon).
    from kernels.quant import W8, encode, quant_linear, view_planes
    from kernels.quant.packed_linear import packed_tiles

    n, k = 256, 2048
    qw = view_planes(
        fmt, encode(fmt, torch.randn(n, k) * k**-0.5).to(device), (n, k), repack=layout == "gemv"
    )
    x = torch.randn(rows, k, device=device).bfloat16()
    tiles = packed_tiles(fmt, n, k, "pairs_n64s2") if fmt == W8 else None
    off, on = _twice(monkeypatch, lambda: quant_linear(x, qw, route="gemv", tiles=tiles))
    assert torch.equal(off, on)
