# ruff: noqa: B023  (every timed closure runs inside its own loop iteration)
"""Old vs new MoE block at decode: ``SparseMoeBlock.forward`` with the split router (the router linear, then
``moe_route``: cuBLAS under NINFER_GEMV=off; under ``on`` the GEMV and its split-K reduce launch, or with
NINFER_SPLITK_REDUCE=last the GEMV whose last split reduces) against the fused one (``NINFER_MOE_ROUTER=fused``:
``kernels.moe_router``, one launch), then the routed + shared experts (two kernels) in every case.

On a GPU (the Qwen3.6-35B-A3B geometry, rows 1 and 8; under a minute on an H200)::

    python3 bench/kernels/moe_block.py --json bench/results/moe_block_h200_DATE.json

times ``MOE_LAYERS`` blocks (each with its own router and shared expert, the routed experts shared) replayed as
one CUDA graph, the router alone the same way, counts each block's kernels with the torch profiler, and checks
that the fused block is bitwise the split one under NINFER_GEMV=on, batch invariant, and that a graph replay
over new inputs matches eager. On the CPU (``TRITON_INTERPRET=1``, a tiny geometry) it counts the launches only::

    TRITON_INTERPRET=1 PYTHONPATH=$PWD ~/.cache/ninfer-tools/interp-venv/bin/python bench/kernels/moe_block.py --count-only
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import kernels._dispatch as dispatch  # noqa: E402
from engine.model.mlp import SparseMoeBlock  # noqa: E402
from engine.testing.synthetic import GEOMETRIES  # noqa: E402
from kernels.moe import moe_experts  # noqa: E402

MOE_LAYERS = 32  # blocks replayed back to back in one graph (their routers and shared experts exceed L2)
# (name, NINFER_MOE_ROUTER, NINFER_GEMV, NINFER_SPLITK_REDUCE): the engine's default, the profiled GEMV path, the
# GEMV whose last split reduces, the fused router
MODES = (
    ("split, router on cuBLAS", "split", "off", "launch"),
    ("split, router GEMV + reduce launch", "split", "on", "launch"),
    ("split, router GEMV, last split reduces", "split", "on", "last"),
    ("fused router", "fused", "on", "launch"),
)


@contextmanager
def modes(router: str, gemv: str, splitk: str) -> Iterator[None]:
    """The three switches for a while (the launchers read them at every call)."""
    saved = dispatch.MOE_ROUTER_MODE, dispatch.GEMV_MODE, dispatch.SPLITK_REDUCE
    dispatch.MOE_ROUTER_MODE, dispatch.GEMV_MODE, dispatch.SPLITK_REDUCE = router, gemv, splitk
    try:
        yield
    finally:
        dispatch.MOE_ROUTER_MODE, dispatch.GEMV_MODE, dispatch.SPLITK_REDUCE = saved


def make_blocks(count: int, tiny: bool, device: str) -> list[SparseMoeBlock]:
    """``count`` MoE blocks of the 35B-A3B geometry (or a tiny one), random weights, the routed experts shared
    (1.5 GiB each otherwise), each block its own router and shared expert."""
    config = GEOMETRIES["qwen3.6-35b-a3b"]
    if tiny:
        # 256 experts, top 8, H 512 (a router split in 2, as the real one in 8), I = I_s = 32: seconds to interpret
        config = replace(
            config, hidden_size=512, moe_intermediate_size=32, shared_expert_intermediate_size=32
        )
    hidden, inter, experts = config.hidden_size, config.moe_intermediate_size, config.num_experts
    shared_inter = config.shared_expert_intermediate_size
    dtype = torch.bfloat16

    def rand(*shape: int) -> torch.Tensor:
        return (torch.randn(*shape, device=device) * shape[-1] ** -0.5).to(dtype)

    gate_up, down = rand(experts, 2 * inter, hidden), rand(experts, hidden, inter)
    blocks = []
    for _ in range(count):
        with torch.device("meta"):
            block = SparseMoeBlock(config)
        state = {"gate.weight": rand(experts, hidden) * 4, "experts.gate_up_proj": gate_up,
                 "experts.down_proj": down, "shared_expert.gate_proj.weight": rand(shared_inter, hidden),
                 "shared_expert.up_proj.weight": rand(shared_inter, hidden),
                 "shared_expert.down_proj.weight": rand(hidden, shared_inter),
                 "shared_expert_gate.weight": rand(1, hidden)}  # fmt: skip
        block.load_state_dict(state, strict=True, assign=True)
        blocks.append(block.requires_grad_(False).eval())
    return blocks


def count_triton_launches(fn: Callable[[], object]) -> Counter[str]:
    """Triton kernel launches (by name) and F.linear calls that ``fn`` makes (the interpreter's or the JIT's)."""
    import triton.runtime.interpreter as interpreter
    import triton.runtime.jit as jit

    counts: Counter[str] = Counter()
    patched = []
    for cls in (interpreter.InterpretedFunction, jit.JITFunction):
        original = cls.run

        def run(self: Any, *args: Any, _original: Callable[..., Any] = original, **kwargs: Any) -> Any:
            counts[self.fn.__name__ if hasattr(self, "fn") else str(self)] += 1
            return _original(self, *args, **kwargs)

        cls.run = run
        patched.append((cls, original))
    linear = F.linear

    def counted_linear(*args: Any, **kwargs: Any) -> torch.Tensor:
        counts["F.linear (cuBLAS on CUDA)"] += 1
        return linear(*args, **kwargs)

    F.linear = counted_linear
    try:
        fn()
    finally:
        F.linear = linear
        for cls, original in patched:
            cls.run = original
    return counts


def count_cuda_kernels(fn: Callable[[], object]) -> Counter[str]:
    """Every kernel ``fn`` runs on the GPU (torch profiler), by name."""
    from torch.profiler import ProfilerActivity, profile

    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    counts: Counter[str] = Counter()
    for event in prof.events():
        if event.device_type == torch.autograd.DeviceType.CUDA:
            counts[event.name[:60]] += 1
    return counts


def cuda_decode_path(block: SparseMoeBlock, x: torch.Tensor) -> torch.Tensor:
    """What ``SparseMoeBlock.forward`` runs on CUDA for at most FUSED_MAX_TOKENS rows and a dense shared expert
    (the interpreter's CPU tensors would take the CPU branch): the routing, then the two expert kernels."""
    weights, ids = block.route(x)
    experts = block.experts
    return moe_experts(x, experts.gate_up_proj, experts.down_proj, weights, ids, block.shared_weights())


def count_only() -> list[dict]:
    """Per-block launch counts on the CPU (Triton's interpreter; a small geometry, ``make_blocks(tiny=True)``),
    rows 1 and 8, each mode."""
    blocks = make_blocks(1, tiny=True, device="cpu")
    rows = []
    for tokens in (1, 8):
        x = torch.randn(tokens, blocks[0].gate.in_features).bfloat16()
        for name, *switches in MODES:
            with modes(*switches), torch.inference_mode():
                counts = count_triton_launches(lambda: cuda_decode_path(blocks[0], x))
            rows.append(
                {"rows": tokens, "mode": name, "launches": sum(counts.values()), "by_kernel": dict(counts)}
            )
            print(json.dumps(rows[-1]), flush=True)
    return rows


def bench(device: str) -> list[dict]:
    import triton.testing

    blocks = make_blocks(MOE_LAYERS, tiny=False, device=device)
    rows = []
    for tokens in (1, 8):
        x = torch.randn(tokens, blocks[0].gate.in_features, device=device).bfloat16()
        with torch.inference_mode():
            with modes("split", "on", "launch"):
                split = [b(x) for b in blocks[:4]]
            with modes("fused", "on", "launch"):
                fused = [b(x) for b in blocks[:4]]
                alone = blocks[0](x[-1:])
            checks = {
                "fused_bitwise_split_gemv": all(torch.equal(a, b) for a, b in zip(fused, split, strict=True)),
                "fused_batch_invariant": bool(torch.equal(alone[0], fused[0][-1])),
            }
            for name, router, *switches in MODES:
                with modes(router, *switches):

                    def layers() -> None:
                        for block in blocks:
                            block(x)

                    def routers() -> None:
                        for block in blocks:
                            block.route(x)

                    block_us = triton.testing.do_bench_cudagraph(layers, rep=200, return_mode="median") * 1e3
                    route_us = triton.testing.do_bench_cudagraph(routers, rep=200, return_mode="median") * 1e3
                    kernels = count_cuda_kernels(lambda: blocks[0](x))
                    if router == "fused":
                        checks["graph_replay_matches_eager"] = graph_replay_ok(blocks[0], x)
                rows.append({"rows": tokens, "mode": name, "block_us_per_layer": round(block_us / MOE_LAYERS, 2),
                             "router_us_per_layer": round(route_us / MOE_LAYERS, 2),
                             "kernels_per_block": sum(kernels.values()), "by_kernel": dict(kernels), **checks})  # fmt: skip
                print(json.dumps(rows[-1]), flush=True)
        fused_us = rows[-1]["block_us_per_layer"]
        saved = {  # against cuBLAS (the default) and the GEMV + reduce launch (the profiled configuration)
            f"saved_ms_per_step_40_layers_vs_{vs}": round(
                40 * (rows[i]["block_us_per_layer"] - fused_us) / 1e3, 4
            )
            for vs, i in (("cublas", -4), ("gemv_reduce_launch", -3))
        }
        print(json.dumps({"rows": tokens, **saved}), flush=True)
    return rows


def graph_replay_ok(block: SparseMoeBlock, x: torch.Tensor) -> bool:
    """The fused block captured once and replayed over new inputs copied into x: bitwise its eager output."""
    block(x)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        block(x)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = block(x)
    ok = True
    for _ in range(3):
        x.copy_(torch.randn_like(x))
        graph.replay()
        torch.cuda.synchronize()
        ok = ok and torch.equal(captured, block(x))
    return ok


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--json", type=Path, help="where to write the rows")
    p.add_argument("--count-only", action="store_true", help="launch counts only (CPU, TRITON_INTERPRET=1)")
    args = p.parse_args()
    rows = count_only() if args.count_only or not torch.cuda.is_available() else bench("cuda")
    if args.json:
        meta = {"gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu (interpreter)"}
        args.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
