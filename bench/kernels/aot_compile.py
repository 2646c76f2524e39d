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
entry in ``VARIANTS`` (the constexpr values and dtypes its launcher uses at the Qwen3.6-27B geometry; kept
in bench/kernels/aot_variants.py, and bench/kernels/aot_quant.py for kernels/quant/); a kernel without one
is an error, so a new kernel cannot slip past. ``discover`` and ``VARIANTS`` import
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
from dataclasses import dataclass, replace
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
    gluon: bool = (
        False  # a @gluon.jit kernel (Triton's explicit-layout dialect), compiled from GluonASTSource
    )


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
            gluon = any("gluon" in ast.unparse(d) for d in fn.decorator_list)
            kernels.append(KernelSource(module, fn.name, args, constexprs, fn.lineno, gluon))
    return kernels


def _sibling(name: str) -> ModuleType:
    """bench/kernels/<name>.py, loaded by path (the tools venv has no project on sys.path, and the tests load
    this file by path as well)."""
    spec = importlib.util.spec_from_file_location(f"ninfer_{name}", Path(__file__).with_name(f"{name}.py"))
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


# The launch values: bench/kernels/aot_variants.py (kernels/), bench/kernels/aot_quant.py (kernels/quant/)
_variants = _sibling("aot_variants")
Variant = _variants.Variant
VARIANTS: dict[str, list[Variant]] = _variants.VARIANTS
VARIANTS.update(_sibling("aot_quant").variants(Variant))


PDL = "PDL"  # the constexpr of the kernels launched with Programmatic Dependent Launch (kernels/pdl.py)


def variants_of(kernel: KernelSource) -> list[Variant]:
    """The variants ``compile_all`` builds for a kernel: its ``VARIANTS``, and for a kernel with a ``PDL``
    constexpr (kernels/pdl.py) its first variant once more with ``PDL=True`` (label suffixed " PDL"), the build
    ``NINFER_PDL=on`` launches on sm_90+ (its PTX must hold ``griddepcontrol.wait``). A variant that does not name
    ``PDL`` compiles with ``PDL=False`` (the default build)."""
    variants = list(VARIANTS[kernel.name])
    if PDL in kernel.constexprs and variants:
        first = variants[0]
        variants.append(
            replace(first, label=first.label + " PDL", constexprs={**first.constexprs, PDL: True})
        )
    return variants


def signature(kernel: KernelSource, variant: Variant) -> tuple[dict[str, str], dict[str, int | bool]]:
    """(Triton signature {arg: type}, constexprs {arg: value}) for one variant (``PDL`` False unless the variant
    names it); raises on a mismatch."""
    if PDL in kernel.constexprs and PDL not in variant.constexprs:
        variant = replace(variant, constexprs={**variant.constexprs, PDL: False})
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


def compile_options(variant: Variant) -> dict[str, int]:
    """The launch options a variant compiles with (``maxnreg`` only where it caps registers)."""
    options = {"num_warps": variant.num_warps, "num_stages": variant.num_stages}
    return options | ({"maxnreg": variant.maxnreg} if variant.maxnreg is not None else {})


# ---------------------------------------------------------------------------------------------------
# Compiling (needs triton: the tools venv)


def _imported_kernel_modules(path: Path) -> list[Path]:
    """The top-level kernels/*.py modules that ``path`` imports names from (``from kernels.linear import ...``), from
    a kernel package's module too (kernels/quant/triton_gemv.py's ``from kernels.pdl import ...``), and what those
    import in turn (dependencies first)."""
    root = path.parent if path.parent.name == KERNELS_DIR.name else path.parent.parent
    found: list[Path] = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.count(".") == 1:
            package, name = node.module.split(".")
            module = root / f"{name}.py"
            if package != KERNELS_DIR.name or not module.exists() or module == path:
                continue
            for dep in (*_imported_kernel_modules(module), module):
                if dep not in found and dep != path:
                    found.append(dep)
    return found


def _torch_free_module(path: Path, out_dir: Path) -> ModuleType:
    """The jit functions of one kernels/ module, copied into a module that imports only triton. A module of a
    kernel package (kernels/attention/decode.py) brings its siblings' jit functions too: its kernels call the
    helpers they share (kernels/attention/int8.py's ``_dequantize_tile``); so does every top-level kernels
    module it imports from (kernels/moe_router.py calls kernels/linear.py's ``gemv_split_tile``). The module's
    own functions come last, so they win a clash of names. The siblings' imports come too (kernels/quant/
    triton_moe.py calls triton_group.py's helpers, which call kernels/moe.py's ``_moe_shared_weight``)."""
    siblings = [] if path.parent.name == KERNELS_DIR.name else sorted(set(path.parent.glob("*.py")) - {path})
    chunks = [
        "import triton\nimport triton.language as tl\n"
        "from triton.experimental import gluon\nfrom triton.experimental.gluon import language as gl\n"
        "from triton.experimental.gluon.language.nvidia.ampere import async_copy\n"
    ]
    imported: list[Path] = []
    for file in (path, *siblings):
        imported += [m for m in _imported_kernel_modules(file) if m not in imported and m not in siblings]
    for file in (*imported, *siblings, path):
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


_GLOBAL_MEMORY_OP = re.compile(
    r"^\s*(?:@%\w+\s+)?(?:ld\.global|st\.global|cp\.async\.|atom\.|red\.)", re.MULTILINE
)


def memory_ops_before_wait(ptx: str) -> int | None:
    """Global loads, stores, async copies and atomics in the PTX before its first ``griddepcontrol.wait``
    (L2 prefetches of weights are not counted); None when there is no wait. A PDL build must have none: every
    read of a predecessor's output and every write comes after the wait (kernels/pdl.py)."""
    at = ptx.find("griddepcontrol.wait")
    return None if at < 0 else len(_GLOBAL_MEMORY_OP.findall(ptx[:at]))


_PARAM = re.compile(r"\[\s*\w+_param_(\d+)\s*\]")
_REGISTER = re.compile(r"%\w+")
_PREDICATE = re.compile(r"^@!?%\w+\s+")


def _operands(text: str) -> list[str]:
    """A PTX statement's operands, split at the commas outside braces and brackets."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(text):
        depth += ch in "{[" or -(ch in "}]")
        if ch == "," and depth == 0:
            parts.append(text[start:i].strip())
            start = i + 1
    return [*parts, text[start:].strip()] if text.strip() else parts


def reads_before_wait(ptx: str, params: list[str]) -> dict[str, Any] | None:
    """What the PTX does to global memory before its first ``griddepcontrol.wait``: ``loads_from``, the kernel
    arguments (``params``: the non-constexpr arguments in order, the PTX's ``_param_<i>``) that the addresses of its
    global loads and async copies derive from (a register's sources followed through every instruction, from the
    ``ld.param`` that read them), the ``_ptr`` ones sorted; ``writes``, its stores and atomics. None when there is
    no wait. A kernel that loads its first WEIGHT tiles before the wait (kernels/pdl.py) must show only weight
    pointers there and no write; L2 prefetches are not loads."""
    at = ptx.find("griddepcontrol.wait")
    if at < 0:
        return None
    sources: dict[str, set[int]] = {}  # register -> the params it derives from
    loads: set[int] = set()
    writes = 0
    for line in ptx[:at].splitlines():
        for statement in line.split("//")[0].split(";"):
            statement = _PREDICATE.sub("", statement.strip().lstrip("{").rstrip("}").strip())
            if not statement or statement.startswith((".", "$")):
                continue
            opcode, _, rest = statement.partition(" ")
            ops = _operands(rest)
            if opcode.startswith(("st.", "atom.", "red.")):
                writes += 1
                continue
            if not ops or opcode.startswith("prefetch"):
                continue
            if opcode.startswith("ld.param"):
                found = _PARAM.search(rest)
                derived = {int(found.group(1))} if found else set()
            else:
                derived = set().union(
                    *(sources.get(r, set()) for op in ops[1:] for r in _REGISTER.findall(op))
                )
            if opcode.startswith(("ld.global", "cp.async")):
                address = [op for op in ops if op.startswith("[")]
                loads |= set().union(
                    *(sources.get(r, set()) for op in address for r in _REGISTER.findall(op))
                )
            for register in _REGISTER.findall(ops[0]):
                sources[register] = derived
    names = [params[i] for i in sorted(loads) if i < len(params)]
    return {"loads_from": sorted(n for n in names if n.endswith("_ptr")), "writes": writes}


def compile_all(
    targets: tuple[str, ...] = DEFAULT_TARGETS, kernels_dir: Path = KERNELS_DIR, only: str | None = None
) -> dict[str, Any]:
    """Compile every discovered kernel's every variant (``variants_of``) for every target; a report with one row
    each. ``only``: a regular expression; then just the kernels whose name it matches (``re.search``)."""
    import triton
    import triton.backends.nvidia.compiler as nvidia
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    kernels = [k for k in discover(kernels_dir) if only is None or re.search(only, k.name)]
    unspecified = [k.name for k in kernels if k.name not in VARIANTS]
    if unspecified:
        raise SystemExit(
            f"no AOT variants for {unspecified}: add their launch values to VARIANTS in "
            f"{Path(__file__).with_name('aot_variants.py')}"
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
            for variant in variants_of(kernel):
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
                        "target": target, **compile_options(variant),
                    }  # fmt: skip
                    start = time.perf_counter()
                    try:
                        source = GluonASTSource if kernel.gluon else triton.compiler.ASTSource
                        src = source(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
                        compiled = triton.compile(
                            src,
                            target=GPUTarget(backend, int(arch), 32),
                            options=compile_options(variant),
                        )
                    except Exception as exc:  # noqa: BLE001  (recorded per row; the caller fails on it)
                        row.update(
                            ok=False, error=f"{type(exc).__name__}: {exc} <- {exc.__cause__!r}"[-4000:]
                        )
                        rows.append(row)
                        continue
                    cubin = compiled.asm.get("cubin", b"")
                    ptx = compiled.asm.get("ptx", "")
                    meta = compiled.metadata
                    row.update(
                        ok=bool(cubin),
                        compile_s=round(time.perf_counter() - start, 3),
                        cubin_bytes=len(cubin),
                        ptx_target=_ptx_target(ptx),
                        griddepcontrol_wait=ptx.count("griddepcontrol.wait"),
                        memory_ops_before_wait=memory_ops_before_wait(ptx),
                        before_wait=reads_before_wait(ptx, [a for a in kernel.args if sig[a] != "constexpr"]),
                        triton_shared_bytes=meta.shared,
                        **(_resource_usage(cuobjdump, cubin, work) if cubin else {}),
                    )
                    rows.append(row)
    return {
        "what": "Triton ahead-of-time compile of every kernels/ @triton.jit kernel, 27B launch values"
        + (f" (only the kernels matching {only!r})" if only else ""),
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
    p.add_argument("--only", metavar="REGEX", help="compile only the kernels whose name matches (re.search)")
    args = p.parse_args(argv)
    report = compile_all(tuple(args.target or DEFAULT_TARGETS), args.kernels_dir, args.only)
    args.json.parent.mkdir(parents=True, exist_ok=True)
    args.json.write_text(json.dumps(report, indent=1) + "\n")
    for row in report["rows"]:
        status = f"{row['cubin_bytes']:>7} B cubin, {row.get('registers')} regs" if row["ok"] else "FAILED"
        if row["ok"]:
            status += (
                f", {row.get('local_bytes')} B local (spills), {row.get('triton_shared_bytes')} B shared"
            )
        print(f"{row['target']:<9} {row['kernel']:<32} {row['variant']:<30} {status}")
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
