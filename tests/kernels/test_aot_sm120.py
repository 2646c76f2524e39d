"""Every Triton kernel in kernels/ compiles ahead of time for sm_120 (RTX 5090), and for sm_90 beside it.

No GPU: Triton's compiler and the ptxas in its wheel build the cubins on this CPU machine. Triton lives in
the tools venv of ``scripts/setup/40-triton-aot.sh`` (never in the project's venv), so the compile runs in
a subprocess with that venv's python through ``bench/kernels/aot_compile.py``, which also writes the
recorded report in bench/results/. Kernels are discovered from the source (``_<op>_kernel`` @triton.jit
functions), so a new kernel is compiled here, or fails here until it has launch values in ``VARIANTS``.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "bench" / "kernels" / "aot_compile.py"
TARGETS = ("cuda:120", "cuda:90")
KNOWN_KERNELS = {
    "_rms_norm_kernel",
    "_causal_conv1d_decode_kernel",
    "_causal_conv1d_varlen_kernel",
    "_apply_rope_qk_kernel",
    "_gated_delta_rule_decode_kernel",
    "_store_kv_kernel",
    "_paged_attention_decode_kernel",
    "_paged_attention_decode_int8_kernel",
    "_paged_attention_decode_int8_km_kernel",
    "_paged_attention_reduce_kernel",
    "_paged_prefill_attention_kernel",
    "_moe_route_kernel",
    "_moe_router_kernel",
    "_moe_gate_up_kernel",
    "_moe_down_kernel",
    "_moe_combine_kernel",
    "_silu_mul_kernel",
    "_sigmoid_gate_mul_kernel",
    "_linear_gemv_kernel",
    "_linear_reduce_kernel",
    "_quant_gemv_group_kernel",
    "_quant_gemm_group_kernel",
    "_quant_gemv_nvfp4_kernel",
    "_quant_gemm_nvfp4_kernel",
    "_quant_gemv_fp8_kernel",
    "_quant_gemm_fp8_kernel",
    "_quant_moe_gate_up_kernel",
    "_quant_moe_down_kernel",
    "_quant_moe_gate_up_v2_kernel",
    "_quant_moe_down_v2_kernel",
    "_quant_dequant_group_kernel",
    "_quant_dequant_fp_kernel",
    "_quant_gemv_packed_kernel",
    "_quant_dequant_packed_kernel",
    "_apply_token_bitmask_kernel",
    "_qk_norm_rope_store_kernel",
    "_quant_gemv_pairs_kernel",  # Gluon (kernels/quant/gluon_gemv.py)
    "_quant_gemv_mma_kernel",
    "_quant_gemv_w8_pairs_kernel",
    "_quant_gemv_fp8_rows_kernel",
    "_quant_gemv_nvfp4_rows_kernel",
    "_quant_gemv_ring_kernel",  # the cp.async ring GEMVs (Gluon)
    "_quant_gemv_mma_ring_kernel",
    "_quant_gemv_nvfp4_ring_kernel",
    "_quant_gemv_fp8_ring_kernel",
    "_quant_gemv_w8_ring_kernel",
    "_copy_state_slots_kernel",
}
# the PDL kernels that load their first step of WEIGHT planes before griddepcontrol.wait (kernels/pdl.py; the source
# side: tests/kernels/test_pdl.py's WEIGHT_LOADS_BEFORE_WAIT), and the arguments those loads may read
WEIGHTS_FIRST = {
    "_quant_gemv_packed_kernel", "_quant_gemv_pairs_kernel", "_quant_gemv_mma_kernel", "_quant_gemv_w8_pairs_kernel",
    "_quant_gemv_fp8_rows_kernel", "_quant_gemv_nvfp4_rows_kernel", "_quant_gemv_ring_kernel",
    "_quant_gemv_mma_ring_kernel", "_quant_gemv_nvfp4_ring_kernel", "_quant_gemv_fp8_ring_kernel",
    "_quant_gemv_w8_ring_kernel",
}  # fmt: skip
WEIGHT_POINTERS = {"codes_ptr", "high_ptr", "scales_ptr"}


def _tools_python() -> Path:
    tools = Path(os.environ.get("NINFER_TOOLS") or Path.home() / ".cache" / "ninfer-tools")
    return tools / "triton-venv" / "bin" / "python"


@pytest.fixture(scope="module")
def aot() -> ModuleType:
    """bench/kernels/aot_compile.py, imported without triton (discovery and launch values only)."""
    spec = importlib.util.spec_from_file_location("ninfer_aot_compile", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve annotations through sys.modules
    spec.loader.exec_module(module)
    return module


class AotCompile:
    """The compile subprocess (the tools venv's python running aot_compile.py) and where its report lands.

    conftest.py starts it when the session's collection holds the compile test, so on CI's two cores it runs
    beside the rest of the suite instead of holding the suite for its ~2 minutes; the ``report`` fixture
    waits for it (or starts it there when this module runs alone). Under pytest-xdist every worker collects the
    whole suite: the workers share one directory (``shared_dir``), the first to claim it starts the compile and
    any worker's ``report`` waits for its exit-status file."""

    def __init__(self, tmp: Path) -> None:
        python = _tools_python()
        if not python.exists():
            pytest.fail(
                f"{python} is missing: the Triton AOT tools venv is built by scripts/setup/40-triton-aot.sh "
                "(`make system`); this test must not skip without it"
            )
        tmp.mkdir(parents=True, exist_ok=True)
        self.out, self.rc, log = tmp / "triton_aot_sm120.json", tmp / "aot.rc", tmp / "aot.log"
        self.log = log
        self.proc: subprocess.Popen[str] | None = None
        try:
            (tmp / "claimed").mkdir()
        except FileExistsError:
            return  # another worker started it
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRITON_")}
        env["TRITON_CACHE_DIR"] = str(tmp / "triton-cache")
        cmd = [str(python), str(SCRIPT), "--json", str(self.out)] + [f"--target={t}" for t in TARGETS]
        script = f"{shlex.join(cmd)} >{shlex.quote(str(log))} 2>&1; echo $? >{self.rc}.tmp && mv {self.rc}.tmp {self.rc}"
        self.proc = subprocess.Popen(["bash", "-c", script], cwd=REPO, env=env, text=True)

    @staticmethod
    def shared_dir(factory: pytest.TempPathFactory) -> Path:
        """One directory per run that every xdist worker (or the lone process) resolves alike."""
        base = factory.getbasetemp()
        return (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "aot-shared"

    def wait(self) -> tuple[int, str]:
        deadline = time.monotonic() + 900
        while not self.rc.exists():
            if time.monotonic() > deadline:
                if self.proc is not None:
                    self.proc.kill()
                raise TimeoutError(f"the AOT compile did not finish in 900 s ({self.log})")
            time.sleep(1.0)
        if self.proc is not None:
            self.proc.wait()
        output = self.log.read_text() if self.log.exists() else ""
        return int(self.rc.read_text().strip() or 1), output


@pytest.fixture(scope="module")
def report(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The AOT report for every kernel and target, compiled fresh (own Triton cache) in the tools venv."""
    started: AotCompile | None = getattr(request.config, "_ninfer_aot_compile", None)
    compile_ = started or AotCompile(AotCompile.shared_dir(tmp_path_factory))
    rc, output = compile_.wait()
    assert compile_.out.exists(), f"no report (rc {rc}):\n{output[-6000:]}"
    data: dict[str, Any] = json.loads(compile_.out.read_text())
    failed = [
        f"{r['target']} {r['kernel']} [{r['variant']}]: {r.get('error')}" for r in data["rows"] if not r["ok"]
    ]
    assert rc == 0 and not failed, "\n".join(failed) or output[-6000:]
    return data


def test_discovery_finds_every_kernel(aot: ModuleType) -> None:
    found = {k.name for k in aot.discover()}
    assert KNOWN_KERNELS <= found, f"discovery missed {KNOWN_KERNELS - found}"
    assert found <= set(aot.VARIANTS), f"no AOT launch values in VARIANTS for {found - set(aot.VARIANTS)}"
    assert set(aot.VARIANTS) <= found, (
        f"VARIANTS names kernels that no longer exist: {set(aot.VARIANTS) - found}"
    )


def test_launch_values_match_signatures(aot: ModuleType) -> None:
    for kernel in aot.discover():
        for variant in aot.VARIANTS[kernel.name]:
            sig, constexprs = aot.signature(kernel, variant)  # raises on a missing or unknown argument
            assert list(sig) == list(kernel.args)
            assert (
                {a for a, t in sig.items() if t == "constexpr"} == set(constexprs) == set(kernel.constexprs)
            )


def test_discovery_covers_a_new_kernel(aot: ModuleType, tmp_path: Path) -> None:
    pkg = tmp_path / "kernels"
    pkg.mkdir()
    (pkg / "new_op.py").write_text(
        "import torch\nfrom kernels._dispatch import HAS_TRITON\n"
        "if HAS_TRITON:\n    import triton\n    import triton.language as tl\n\n"
        "    @triton.jit\n    def _helper(x):\n        return x\n\n"
        "    @triton.jit\n    def _new_op_kernel(x_ptr, n, BLOCK: tl.constexpr):\n        pass\n"
    )
    (kernel,) = aot.discover(pkg)
    assert (kernel.module, kernel.name, kernel.args, kernel.constexprs) == (
        "kernels.new_op",
        "_new_op_kernel",
        ("x_ptr", "n", "BLOCK"),
        ("BLOCK",),
    )
    assert kernel.name not in aot.VARIANTS  # so compile_all would refuse it until it has launch values


def test_every_kernel_compiles_for_sm120_and_sm90(aot: ModuleType, report: dict[str, Any]) -> None:
    assert set(report["kernels"]) == {k.name for k in aot.discover()}
    assert report["targets"] == list(TARGETS) and report["ok"] is True
    assert report["triton"] and report["commit"]
    rows = {(r["kernel"], r["variant"], r["target"]): r for r in report["rows"]}
    for kernel in aot.discover():
        for variant in aot.VARIANTS[kernel.name]:
            for target in TARGETS:
                row = rows[(kernel.name, variant.label, target)]
                arch = "sm_" + target.split(":")[1]
                where = f"{target} {kernel.name} [{variant.label}]"
                assert row["ok"] and row["cubin_bytes"] > 0, where
                assert row["elf_arch"].startswith(arch), f"{where}: cubin is {row['elf_arch']}"
                assert row["ptx_target"].startswith(arch), f"{where}: PTX targets {row['ptx_target']}"
                assert 0 < row["registers"] <= 255, f"{where}: {row['registers']} registers"
                assert row["triton_shared_bytes"] >= 0 and row["local_bytes"] >= 0, where


def test_pdl_builds_wait_before_every_memory_access(aot: ModuleType, report: dict[str, Any]) -> None:
    # NINFER_PDL (kernels/pdl.py): each kernel with a PDL constexpr also compiles with PDL=True (variants_of); that
    # build's PTX holds griddepcontrol.wait with no global load, store, async copy or atomic before it (L2 prefetches
    # of weights aside), except in the WEIGHTS_FIRST kernels: their loads before the wait read weight planes alone
    # (traced in the PTX from the kernel's pointer arguments: codes, high bits, scales; never x, the page table or
    # the output) and they do load there (the prefetch is in the build); no build writes before its wait; every
    # default build holds no wait at all
    rows = {(r["kernel"], r["variant"], r["target"]): r for r in report["rows"]}
    pdl_kernels = [k for k in aot.discover() if aot.PDL in k.constexprs]
    assert {"_linear_gemv_kernel", "_rms_norm_kernel", "_gated_delta_rule_decode_kernel",
            "_paged_attention_decode_kernel", "_paged_attention_decode_int8_kernel",
            "_paged_attention_decode_int8_km_kernel", "_paged_attention_reduce_kernel", "_qk_norm_rope_store_kernel",
            "_quant_moe_gate_up_kernel", "_quant_moe_down_kernel", "_quant_moe_gate_up_v2_kernel",
            "_quant_moe_down_v2_kernel", *WEIGHTS_FIRST} <= {k.name for k in pdl_kernels}  # fmt: skip
    for kernel in aot.discover():
        for variant in aot.variants_of(kernel):
            pdl = variant.constexprs.get(aot.PDL, False)
            for target in TARGETS:
                row = rows[(kernel.name, variant.label, target)]
                where = f"{target} {kernel.name} [{variant.label}]"
                if pdl:
                    assert row["griddepcontrol_wait"] >= 1 and row["before_wait"]["writes"] == 0, where
                    if kernel.name in WEIGHTS_FIRST:
                        loads_from = set(row["before_wait"]["loads_from"])
                        assert "codes_ptr" in loads_from and loads_from <= WEIGHT_POINTERS, (
                            where,
                            loads_from,
                        )
                    else:
                        assert row["memory_ops_before_wait"] == 0, where
                else:
                    assert row["griddepcontrol_wait"] == 0, where
    assert sum(aot.PDL in v.label for k in pdl_kernels for v in aot.variants_of(k)) == len(pdl_kernels)


def test_memory_ops_before_wait_counts_what_precedes_the_first_wait(aot: ModuleType) -> None:
    ptx = (
        "\tld.param.u64 %rd1, [p];\n\tprefetch.global.L2 [%rd1];\n\t@%p1 ld.global.v4.b32 {%r1}, [%rd1];\n"
        "\tgriddepcontrol.wait; // dummy %r2\n\tst.global.b16 [%rd1], %rs1;\n"
    )
    assert (
        aot.memory_ops_before_wait(ptx) == 1
    )  # the predicated load; the param load and the prefetch are fine
    assert aot.memory_ops_before_wait(ptx.replace("griddepcontrol.wait", "bar.sync 0")) is None


def test_reads_before_wait_follows_addresses_to_the_arguments(aot: ModuleType) -> None:
    # x_ptr (param 0) and codes_ptr (param 1): the codes load before the wait derives from param 1 through an add, a
    # predicated vector load's too; the x load after the wait does not count; a store before it does
    ptx = (
        "\tld.param.b64 %rd1, [k_param_0];\n\tld.param.b64 %rd2, [k_param_1];\n\tld.param.b32 %r1, [k_param_2];\n"
        "\tmul.wide.s32 %rd3, %r1, 4;\n\tadd.s64 %rd4, %rd2, %rd3; // codes row\n"
        "\t@%p1 ld.global.v4.b32 { %r2, %r3, %r4, %r5 }, [ %rd4 + 0 ];\n"
        "\tprefetch.global.L2 [%rd1];\n\tgriddepcontrol.wait; // dummy %r6\n\tld.global.b32 { %r7 }, [ %rd1 + 0 ];\n"
    )
    params = ["x_ptr", "codes_ptr", "stride"]
    assert aot.reads_before_wait(ptx, params) == {"loads_from": ["codes_ptr"], "writes": 0}
    early_x = ptx.replace("\tprefetch.global.L2 [%rd1];", "\tld.global.b32 { %r8 }, [ %rd1 + 0 ];")
    assert aot.reads_before_wait(early_x, params) == {"loads_from": ["codes_ptr", "x_ptr"], "writes": 0}
    store = ptx.replace("\tprefetch.global.L2 [%rd1];", "\tst.global.b32 [ %rd1 + 0 ], { %r2 };")
    assert aot.reads_before_wait(store, params) == {"loads_from": ["codes_ptr"], "writes": 1}
    assert aot.reads_before_wait(ptx.replace("griddepcontrol.wait", "bar.sync 0"), params) is None


def test_sass_loop_counter_takes_the_longest_backward_branch() -> None:
    # bench/kernels/aot_sass.py reads a kernel's main loop from cuobjdump's SASS: the instructions from a backward
    # branch's target to the branch, the longest first, counted by opcode (predicates and modifiers aside)
    spec = importlib.util.spec_from_file_location("ninfer_aot_sass", SCRIPT.with_name("aot_sass.py"))
    assert spec is not None and spec.loader is not None
    sass_tool = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(sass_tool)
    sass = "\n".join(
        f"        /*{addr:04x}*/                   {text} ;   /* 0x000000ff00007816 */"
        for addr, text in [
            (0x00, "S2R R0, SR_TID.X"),
            (0x10, "LDG.E R2, desc[UR4][R4.64]"),  # inner loop 0x10..0x30
            (0x20, "@P0 HMMA.16816.F32 R4, R8, R12, R4"),
            (0x30, "@!P1 BRA 0x10"),
            (0x40, "PRMT R1, R2, 0x5140, R3"),
            (0x50, "BRA 0x00"),  # the outer loop 0x00..0x50
            (0x60, "BRA 0x70"),  # forward: no loop
            (0x70, "EXIT"),
        ]
    )
    loops = sass_tool.sass_loops(sass)
    assert [len(loop) for loop in loops] == [6, 3]
    assert sass_tool.summarize_loop(loops[1]) == {
        "instructions": 3,
        "by_opcode": {"LDG": 1, "HMMA": 1, "BRA": 1},
    }
