"""Registers, spills and the SASS of one kernel's main loop, from the AOT build (no GPU): for comparing kernel
variants' issue cost before they are timed.

    /work/interp-venv/bin/python bench/kernels/aot_sass.py _paged_attention_decode_int8_kernel \\
        [--variant SUBSTRING] [--target cuda:90] [--json out.json] [--dump DIR]

Compiles each ``VARIANTS`` entry of the kernel (bench/kernels/aot_variants.py, as aot_compile.py does) and reads
the cubin with the wheel's ``cuobjdump``: registers and local memory (``--dump-resource-usage``), and the static
instruction count of the longest loop (a backward branch's span in ``-sass``, the kernel's main loop), by opcode
(the opcode's first word: ``HMMA``, ``LDS``, ``PRMT``, ...). ``STL``/``LDL`` in the loop are spills. ``--dump``
writes each variant's SASS and ptxas ``-v`` output there.
"""

from __future__ import annotations

import argparse
import collections
import importlib.util
import json
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

_INSTR = re.compile(r"/\*([0-9a-f]{4,})\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)([^;]*);")


def _aot() -> Any:
    spec = importlib.util.spec_from_file_location(
        "ninfer_aot_compile", Path(__file__).with_name("aot_compile.py")
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def sass_loops(sass: str) -> list[list[str]]:
    """The instructions (opcodes with modifiers) of every backward branch's span, longest first."""
    instrs = [(int(m.group(1), 16), m.group(3), m.group(4)) for m in _INSTR.finditer(sass)]
    loops = []
    for i, (addr, op, rest) in enumerate(instrs):
        target = re.search(r"0x([0-9a-f]+)", rest)
        if op.startswith("BRA") and target and int(target.group(1), 16) < addr:
            start = int(target.group(1), 16)
            loops.append([o for a, o, _ in instrs[: i + 1] if a >= start])
    return sorted(loops, key=len, reverse=True)


def summarize_loop(ops: list[str]) -> dict[str, Any]:
    by_op = collections.Counter(op.split(".")[0] for op in ops)
    return {"instructions": len(ops), "by_opcode": dict(by_op.most_common())}


def analyse(kernel_name: str, variant_filter: str, target: str, dump: Path | None) -> list[dict[str, Any]]:
    import triton
    import triton.backends.nvidia.compiler as nvidia
    from triton.backends.compiler import GPUTarget

    aot = _aot()
    (kernel,) = [k for k in aot.discover() if k.name == kernel_name]
    cuobjdump = nvidia.knobs.nvidia.cuobjdump.path
    rows = []
    with tempfile.TemporaryDirectory(prefix="ninfer-sass-") as tmp:
        work = Path(tmp)
        path = aot.KERNELS_DIR.joinpath(*kernel.module.split(".")[1:]).with_suffix(".py")
        fn = getattr(aot._torch_free_module(path, work), kernel.name)
        for variant in aot.VARIANTS[kernel.name]:
            if variant_filter not in variant.label:
                continue
            sig, constexprs = aot.signature(kernel, variant)
            attrs = {
                (i,): [["tt.divisibility", 16]]
                for i, a in enumerate(kernel.args)
                if a in variant.ptrs or a in variant.aligned
            }
            if kernel.gluon:  # (Triton's explicit-layout dialect: its own source class, as aot_compile.py)
                from triton.experimental.gluon._runtime import GluonASTSource as source
            else:
                source = triton.compiler.ASTSource
            src = source(fn=fn, signature=sig, constexprs=constexprs, attrs=attrs)
            backend, arch = target.split(":")
            compiled = triton.compile(
                src, target=GPUTarget(backend, int(arch), 32), options=aot.compile_options(variant)
            )
            cubin = work / "k.cubin"
            cubin.write_bytes(compiled.asm["cubin"])
            sass = subprocess.run(
                [cuobjdump, "-sass", str(cubin)], capture_output=True, text=True, check=True
            ).stdout
            loops = sass_loops(sass)
            row = {
                "kernel": kernel_name,
                "variant": variant.label,
                "target": target,
                **aot.compile_options(variant),
                **aot._resource_usage(cuobjdump, compiled.asm["cubin"], work),
                "triton_shared_bytes": compiled.metadata.shared,
                "loop": summarize_loop(loops[0]) if loops else None,
            }
            rows.append(row)
            if dump is not None:
                dump.mkdir(parents=True, exist_ok=True)
                stem = re.sub(r"\W+", "_", f"{kernel_name}_{variant.label}_{arch}")
                (dump / f"{stem}.sass").write_text(sass)
                (dump / f"{stem}.ptx").write_text(compiled.asm["ptx"])
    return rows


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("kernel")
    p.add_argument("--variant", default="", help="only the variants whose label contains this")
    p.add_argument("--target", default="cuda:90")
    p.add_argument("--json", type=Path)
    p.add_argument("--dump", type=Path)
    args = p.parse_args()
    rows = analyse(args.kernel, args.variant, args.target, args.dump)
    for row in rows:
        loop = row["loop"] or {}
        print(f"{row['target']} {row['variant']}: {row['registers']} regs, local {row['local_bytes']} B, "
              f"shared {row['triton_shared_bytes']} B; loop {loop.get('instructions')} instructions")  # fmt: skip
        print("   ", json.dumps(loop.get("by_opcode")))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
