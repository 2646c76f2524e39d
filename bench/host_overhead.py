"""Host time of an eager decode step: the real layer counts and layer order, tiny widths.

In eager mode (``--no-cuda-graph``) the host launches every kernel of a decode step, one layer after another, so
the Python per layer (module calls, projection splits, kernel dispatch, the launchers themselves) is the step
time. This builds the real geometries' module structure (64 layers for qwen3.6-27b, 40 with 256 experts top-8
for qwen3.6-35b-a3b; the layer-type pattern of the real model) at the tiny test model's widths, so the device math
is negligible, and times eager decode steps through ``ModelRunner.execute`` (greedy, each sampled token fed
back: the engine's own step, as ``ninfer-bench`` times it).

    python3 bench/host_overhead.py [--device cpu|cuda] [--geometry qwen3.6-27b,qwen3.6-35b-a3b]
                                   [--concurrency 1,8] [--steps 20] [--repeats 7] [--profile] [--json OUT]

Prints, per geometry and concurrency, the wall time and this thread's CPU time per step (median and best of
``--repeats`` runs of ``--steps`` steps) and per layer: on a busy machine the CPU time is the steadier figure (it
leaves out the time other processes hold the cores; on CUDA it also counts the host's spin while it waits for
the device at the step's one sync). On CUDA the widths are the ones the GPU tests run the Triton kernels at, so
the numbers are the real launch path's host cost; on the CPU the torch references run instead (more ops per
kernel than one launch), which is what ``--profile`` separates: Python calls per step and own time by where
the code lives (engine, kernels, nn.Module's call machinery, torch's C ops).

``--engine-only`` times one decode forward with every kernel launcher the model calls replaced by a stub that
allocates its output (``STUBS``): the model's own Python per layer, whatever the kernels cost (best and median
thread CPU time of ``--repeats * --steps`` forwards; the best is the steadiest figure on a shared machine).

Runs against an older tree too (the pre-#16 layout: ``engine.bench``, ``engine.synthetic``), to compare the
same step before and after a change: ``PYTHONPATH=/path/to/old/tree python3 bench/host_overhead.py``.
"""

from __future__ import annotations

import argparse
import collections
import cProfile
import dataclasses
import json
import pstats
import statistics
import time
from typing import Any

import torch

try:
    from engine.testing.bench.steps import _request, _step, make_runner
    from engine.testing.synthetic import GEOMETRIES, build_synthetic

    LAYOUT = "engine.testing (#16)"
except ImportError:  # NOTE: the pre-#16 layout, to time a baseline tree with this same script
    from engine.bench import _request, _step, make_runner  # type: ignore[no-redef]
    from engine.synthetic import GEOMETRIES, build_synthetic  # type: ignore[no-redef]

    LAYOUT = "engine.bench (pre-#16)"

from engine.model.config import ModelConfig

# The tiny test model's widths (engine/testing/tiny.py), which the Triton kernels run at in the GPU tests.
TINY_WIDTHS: dict[str, Any] = dict(
    vocab_size=1024, hidden_size=64, num_attention_heads=4, num_key_value_heads=2, head_dim=32,
    mrope_section=(2, 1, 1), linear_key_head_dim=16, linear_value_head_dim=16, linear_num_key_heads=2,
    linear_num_value_heads=4,
)  # fmt: skip
PAGE_SIZE = 64
CONTEXT = 256  # tokens already "cached" (zeros) before the timed steps


def tiny_geometry(name: str) -> ModelConfig:
    """Geometry `name`'s layer count, layer types and expert routing (E, top-k) at tiny widths."""
    config = GEOMETRIES[name]
    widths = dict(TINY_WIDTHS)
    if config.is_moe:
        widths.update(moe_intermediate_size=48, shared_expert_intermediate_size=48)
    else:
        widths.update(intermediate_size=160)
    return dataclasses.replace(config, **widths)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


class Decoder:
    """C lanes decoding from ``CONTEXT`` cached tokens; ``steps(n)`` runs n more eager steps."""

    def __init__(self, runner: Any, config: ModelConfig, concurrency: int, max_steps: int) -> None:
        self.runner, self.concurrency = runner, concurrency
        per_lane = -(-(CONTEXT + max_steps + 1) // PAGE_SIZE)
        self.pages = [tuple(range(i * per_lane, (i + 1) * per_lane)) for i in range(concurrency)]
        self.tokens = torch.randint(0, config.vocab_size, (concurrency,)).tolist()
        self.pos = CONTEXT

    def steps(self, n: int) -> None:
        for _ in range(n):
            rows = [
                _request(f"d{i}", [self.tokens[i]], self.pos, self.pages[i], i, False, True)
                for i in range(self.concurrency)
            ]
            self.tokens = _step(self.runner, self.pos, rows)
            self.pos += 1


def _where(path: str) -> str:
    if "/engine/" in path:
        return "engine"
    if "/kernels/" in path:
        return "kernels"
    if path.endswith("torch/nn/modules/module.py"):
        return "nn.Module calls"
    return "other"


def profile_step(decoder: Decoder, steps: int, num_layers: int) -> dict[str, Any]:
    """cProfile ``steps`` steps: calls per step and per layer by where the calling code lives: ``engine`` (the
    model, runner, step contract; their own Python functions and the torch ops / builtins they call directly),
    ``kernels`` (the launchers and, on the CPU, the references' torch ops), ``nn.Module calls`` (the
    ``module(x)`` machinery), ``other`` (torch's Python wrappers, the stdlib)."""
    prof = cProfile.Profile()
    prof.enable()
    decoder.steps(steps)
    prof.disable()
    calls: collections.Counter[str] = collections.Counter()
    seconds: collections.Counter[str] = collections.Counter()
    engine: collections.Counter[str] = collections.Counter()
    stats = pstats.Stats(prof).stats  # type: ignore[attr-defined]
    for (path, _, func), (_, ncalls, own, _, callers) in stats.items():
        if path != "~":  # a Python function: counted where it lives
            where = _where(path)
            calls[where] += ncalls
            seconds[where] += own
            if where == "engine":
                engine[f"{path.rsplit('/engine/', 1)[1]}:{func}"] += ncalls
            continue
        for (caller_path, _, _), (
            _,
            caller_calls,
            caller_own,
            _,
        ) in callers.items():  # a C function: its callers
            calls[_where(caller_path)] += caller_calls
            seconds[_where(caller_path)] += caller_own
    per_layer = steps * num_layers
    return {
        "calls_per_step": round(sum(calls.values()) / steps),
        "calls_per_layer": round(sum(calls.values()) / per_layer, 1),
        "by_where": {
            w: {
                "calls_per_layer": round(calls[w] / per_layer, 1),
                "own_us_per_layer_profiled": round(seconds[w] / per_layer * 1e6, 1),
            }
            for w in sorted(calls, key=lambda w: -calls[w])
        },  # fmt: skip
        "engine_calls_per_step": {k: round(v / steps, 1) for k, v in engine.most_common(20)},
    }


def measure(name: str, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    config = tiny_geometry(name)
    model = build_synthetic(config, 0, device=device, dtype=dtype)
    total = args.warmup + args.steps * args.repeats + (args.steps if args.profile else 0)
    pages = concurrency * -(-(CONTEXT + total + 1) // PAGE_SIZE) + 1
    runner = make_runner(model, pages, concurrency + 1, "bf16", False, CONTEXT + total + 1)
    decoder = Decoder(runner, config, concurrency, total)
    decoder.steps(args.warmup)
    wall, cpu = [], []
    for _ in range(args.repeats):
        _sync(device)
        start, start_cpu = time.perf_counter(), time.thread_time()
        decoder.steps(args.steps)
        _sync(device)
        wall.append((time.perf_counter() - start) / args.steps)
        cpu.append((time.thread_time() - start_cpu) / args.steps)
    layers = config.num_hidden_layers
    row: dict[str, Any] = {"geometry": name, "concurrency": concurrency, "layers": layers}
    for key, runs in (("wall", wall), ("cpu", cpu)):
        row[f"{key}_step_us_median"] = round(statistics.median(runs) * 1e6, 1)
        row[f"{key}_step_us_best"] = round(min(runs) * 1e6, 1)
        row[f"{key}_layer_us_median"] = round(statistics.median(runs) * 1e6 / layers, 2)
    if args.profile:
        row["profile"] = profile_step(decoder, args.steps, layers)
    return row


def _empty(t: torch.Tensor, *shape: int) -> torch.Tensor:
    return torch.empty(shape or t.shape, dtype=t.dtype, device=t.device)


# ``--engine-only``: every kernel launcher the model's modules call, replaced by a stub that allocates its output
# as a launcher does and returns (the CPU MoE experts too), so what is timed is the model's own Python per layer.
STUBS: dict[str, Any] = {
    "rms_norm": lambda x, w, eps: _empty(x),
    "add_rms_norm": lambda x, r, w, eps: (_empty(x), _empty(x)),
    "gated_rms_norm": lambda x, g, w, eps: _empty(x),
    "linear": lambda x, w: _empty(x, x.shape[0], w.shape[0]),
    "qk_norm_rope_store": lambda query, *args: _empty(query),  # q/k norms, RoPE, KV store
    "paged_attention_decode": lambda q, *args: _empty(q),
    "sigmoid_gate_mul": lambda x, gate: _empty(x),
    "causal_conv1d_decode": lambda x, *args, **kwargs: _empty(x),  # kwargs: out_slots (a verify)
    "gated_delta_rule_decode": lambda q, k, v, *args, **kwargs: _empty(v),
    "silu_mul": lambda gate, up: _empty(gate),
    "moe_route": lambda logits, k: (
        _empty(logits, logits.shape[0], k).float(),
        torch.zeros(logits.shape[0], k, dtype=torch.int64, device=logits.device),
    ),
    "_experts_gathered": lambda x, *args: _empty(x),
    "moe_experts": lambda x, *args: _empty(x),
}


def stub_kernels() -> None:
    """Replace the launchers (``STUBS``) in every ``engine.model`` module that imported them."""
    import importlib
    import pkgutil

    import engine.model

    for info in pkgutil.iter_modules(engine.model.__path__):
        module = importlib.import_module(f"engine.model.{info.name}")
        for name, stub in STUBS.items():
            if hasattr(module, name):
                setattr(module, name, stub)


def measure_engine_only(name: str, concurrency: int, args: argparse.Namespace) -> dict[str, Any]:
    """One eager decode forward (``model(batch, cache)``) with the kernels stubbed: thread CPU time, best and
    median of ``--repeats * --steps`` forwards."""
    device = torch.device(args.device)
    config = tiny_geometry(name)
    model = build_synthetic(
        config, 0, device=device, dtype=torch.float32 if device.type == "cpu" else torch.bfloat16
    )
    per_lane = -(-(CONTEXT + 1) // PAGE_SIZE)
    runner = make_runner(
        model, concurrency * per_lane + 1, concurrency + 1, "bf16", False, per_lane * PAGE_SIZE
    )
    from engine.model.forward import make_forward_batch

    pages = [list(range(i * per_lane, (i + 1) * per_lane)) for i in range(concurrency)]
    batch = make_forward_batch(
        [[1]] * concurrency, [CONTEXT] * concurrency, pages, list(range(concurrency)), page_size=PAGE_SIZE,
        device=device,
    )  # fmt: skip
    times = []
    with torch.inference_mode():
        for _ in range(args.warmup):
            model(batch, runner.cache)
        for _ in range(args.repeats * args.steps):
            start = time.thread_time()
            model(batch, runner.cache)
            times.append(time.thread_time() - start)
    layers = config.num_hidden_layers
    return {
        "geometry": name, "concurrency": concurrency, "layers": layers, "engine_only": True,
        "cpu_forward_us_best": round(min(times) * 1e6, 1),
        "cpu_layer_us_best": round(min(times) * 1e6 / layers, 2),
        "cpu_layer_us_median": round(statistics.median(times) * 1e6 / layers, 2),
    }  # fmt: skip


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cpu", help="cpu (torch references) or cuda (the Triton launchers)")
    p.add_argument("--geometry", default="qwen3.6-27b,qwen3.6-35b-a3b")
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--steps", type=int, default=20, help="steps per timed run")
    p.add_argument("--repeats", type=int, default=7, help="timed runs (median and best reported)")
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (1: the host's own cost)")
    p.add_argument("--profile", action="store_true", help="also cProfile --steps steps: calls and own time")
    p.add_argument(
        "--engine-only",
        action="store_true",
        help="time the model's forward with every kernel launcher stubbed (the model's own Python)",
    )
    p.add_argument("--json", help="write the rows here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    rows = []
    if args.engine_only:
        stub_kernels()
    for name in args.geometry.split(","):
        for c in (int(x) for x in args.concurrency.split(",")):
            if args.engine_only:
                row = measure_engine_only(name, c, args)
                rows.append(row)
                print(f"{name} C={c} ({row['layers']} layers, {args.device}, {LAYOUT}): engine only (kernels "
                      f"stubbed), thread CPU per layer {row['cpu_layer_us_best']:.1f} us best, "
                      f"{row['cpu_layer_us_median']:.1f} us median", flush=True)  # fmt: skip
                continue
            row = measure(name, c, args)
            rows.append(row)
            print(f"{name} C={c} ({row['layers']} layers, {args.device}, {LAYOUT}): per step, median / best: wall "
                  f"{row['wall_step_us_median']:.0f} / {row['wall_step_us_best']:.0f} us, thread CPU "
                  f"{row['cpu_step_us_median']:.0f} / {row['cpu_step_us_best']:.0f} us; per layer (median) wall "
                  f"{row['wall_layer_us_median']:.1f} us, CPU {row['cpu_layer_us_median']:.1f} us", flush=True)  # fmt: skip
            if "profile" in row:
                print(json.dumps(row["profile"], indent=1), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": args.device, "layout": LAYOUT, "torch": torch.__version__, "rows": rows}, f,
                      indent=1)  # fmt: skip


if __name__ == "__main__":
    main()
