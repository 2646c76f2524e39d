"""`ninfer-bench`'s command line: the arguments, the run (limits, prefill, decode, ``--vs-hf``) and its JSON."""

from __future__ import annotations

import argparse
import datetime
import functools
import gc
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core import apply_memory_limit
from engine.model.quant_experts import scratch_bytes
from engine.sampling import default_sampling
from engine.spec.dflash import PUBLISHED_35B_A3B, check_target, random_dflash
from engine.spec.dflash_draft import attach_dflash
from engine.testing.bench.fit import fit_report
from engine.testing.bench.hf import add_speedups, round_sig, time_hf
from engine.testing.bench.server import bench_server as server_bench
from engine.testing.bench.server import table as server_table
from engine.testing.bench.spec import (
    ACCEPTANCE_LENGTH,
    DFLASH_ACCEPTANCE_LENGTH,
    attach_random_draft_head,
    make_spec_runner,
    run_spec_rounds,
)
from engine.testing.bench.steps import (
    GREEDY,
    PAGE_SIZE,
    decode_step_bytes,
    make_runner,
    measure_limits,
    prefill_flops_per_token,
    profile_kernels,
    run_decode,
    run_prefill,
    weight_bytes,
)
from engine.testing.geometry import SYNTHETIC_NAMES, TINY_GEOMETRY, needs_cuda
from engine.testing.synthetic import GEOMETRIES, build_synthetic, synthetic_config
from engine.testing.synthetic_quant import build_synthetic_quantized, synthetic_profile

PROFILED_ROUNDS = 4  # speculative rounds under the profiler (--profile --spec-rounds)
_DESCRIPTION = "speed at the real Qwen3.6-27B and 35B-A3B geometries, with random weights built on the GPU"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"{text!r}: expected comma-separated integers") from exc
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: expected positive integers")
    return values


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ninfer-bench", description=_DESCRIPTION)
    p.add_argument("--synthetic", required=True, choices=SYNTHETIC_NAMES,
                   help=f"geometry, random weights ({TINY_GEOMETRY}: --server only, runs on the CPU)")  # fmt: skip
    p.add_argument("--weights-id", default=None,
                   help="random weights in this profile's formats (a profile key, e.g. qwen3.6-27b/groupwise-int, "
                        "or a kind: groupwise-int, nvfp4, nvfp4-mixed); default: bf16")  # fmt: skip
    p.add_argument("--gpu-memory-limit", type=float, default=None, metavar="GiB",
                   help="cap device memory at this much (as --gpu-memory-limit does for the engine), run under "
                        "it, and report the largest context and lanes that fit (e.g. 32 for an RTX 5090)")  # fmt: skip
    p.add_argument("--kv-dtype", default="bf16", choices=("bf16", "int8"))
    p.add_argument("--prompt-len", type=_ints, default=[7680], help="prefill lengths, comma-separated")
    p.add_argument("--prefill-chunk", type=int, default=8192, help="tokens per prefill step")
    p.add_argument("--prefill-runs", type=int, default=3, help="timed prefill runs per length (median)")
    p.add_argument("--concurrency", type=_ints, default=[1, 2, 4, 8], help="decode concurrencies")
    p.add_argument("--decode-tokens", type=int, default=64, help="timed decode steps per concurrency")
    p.add_argument("--decode-warmup", type=int, default=4, help="untimed decode steps first")
    p.add_argument("--decode-context", type=int, default=1024, help="tokens already cached per sequence")
    p.add_argument("--eager-decode-tokens", type=int, default=8,
                   help="also time this many eager (no-graph) decode steps per concurrency (0 = skip)")  # fmt: skip
    p.add_argument("--no-cuda-graph", action="store_true", help="decode eagerly")
    p.add_argument(
        "--overlap",
        action=argparse.BooleanOptionalAction,
        default=True,
        help="decode with overlap scheduling: launch step N+1 before collecting step N (default on)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="kernel-time breakdown of decode (C=1) and prefill (and of 4 "
        "speculative rounds at the lowest concurrency with --spec-rounds)",
    )
    p.add_argument("--skip-prefill", action="store_true")
    p.add_argument("--skip-decode", action="store_true")
    p.add_argument("--spec-rounds", type=int, default=0, metavar="K",
                   help="also time speculative rounds of K drafts per row (MTP: CUDA graphs unless --no-cuda-graph; "
                   "--spec picks the drafter) against a plain decode step, and project TPOT (0 = skip)")  # fmt: skip
    p.add_argument("--spec-lm-head-draft", action="store_true",
                   help="--spec-rounds with a random 131,072-row reduced proposal head (as --lm-head-draft)")  # fmt: skip
    p.add_argument("--spec", choices=("mtp", "dflash"), default="mtp",
                   help="--spec-rounds drafter: 'dflash' attaches a random DFlash companion (35B-A3B only; K "
                   "1..15; static buffers and CUDA graphs, engine/spec/dflash_graphs.py) and projects at its published 4.95 tokens per round")  # fmt: skip
    p.add_argument("--spec-two-waits", action="store_true",
                   help="--spec-rounds: every round takes the general path, which waits for the verdict and then for "
                   "the drafts (default: greedy rounds wait once, engine/runner/spec_round.py)")  # fmt: skip
    p.add_argument("--spec-sampled", action="store_true",
                   help="--spec-rounds rows sample with the server's non-thinking preset (temperature 0.7, top-p 0.8, "
                   "top-k 20, presence penalty 1.5): the sampled one-wait round (engine/runner/spec_sampled.py; DFlash: "
                   "engine/runner/dflash_round.py), or "
                   "the general round with --spec-two-waits or NINFER_SPEC_ONE_WAIT_SAMPLED=off")  # fmt: skip
    p.add_argument("--json", type=Path, default=None, help="write the results here")
    p.add_argument("--vs-hf", action="store_true", help="also time HF transformers on the same geometry")
    p.add_argument("--hf-max-prompt-len", type=int, default=16384,
                   help="--vs-hf: skip HF prefill above this length (one unchunked forward)")  # fmt: skip
    p.add_argument("--hf-concurrency", type=_ints, default=None,
                   help="--vs-hf: HF decode concurrencies (default: --concurrency)")  # fmt: skip
    p.add_argument("--hf-attn-implementation", default=None,
                   help="--vs-hf: HF attn_implementation (default: transformers' own, sdpa)")  # fmt: skip
    srv = p.add_argument_group(
        "--server: the engine step next to a client's TPOT through ninfer-serve (server.py)"
    )
    srv.add_argument("--server", action="store_true",
                     help="instead of the prefill/decode rows: per --concurrency, the engine's decode step and "
                     "the TPOT/TTFT of streamed Chat Completions (openai SDK) from ninfer-serve on the same flags")  # fmt: skip
    srv.add_argument("--server-prompt-len", type=int, default=1024, help="prompt tokens of each request")
    srv.add_argument(
        "--server-max-tokens", type=int, default=256, help="output tokens of each request (exact)"
    )
    srv.add_argument("--server-args", default="", help="more ninfer-serve flags, one shell-quoted string")
    srv.add_argument(
        "--server-log", type=Path, default=None, help="ninfer-serve's output (default: a temp file)"
    )
    srv.add_argument("--server-timeout", type=float, default=900.0, help="seconds to wait for /ready")
    return p


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    return build_parser().parse_args(argv)


# ---- main ----------------------------------------------------------------------------------------


def _commit() -> str:
    if os.environ.get("NINFER_COMMIT"):
        return os.environ["NINFER_COMMIT"]
    try:
        out = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, check=True)
        return out.stdout.strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def _log(msg: str) -> None:
    print(f"[ninfer-bench] {msg}", flush=True)


def _header(args: argparse.Namespace) -> dict[str, Any]:
    result: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        "commit": _commit(),
        "command": "ninfer-bench " + " ".join(sys.argv[1:]),
        "software": {"torch": torch.__version__, "python": platform.python_version()},
        "geometry": args.synthetic,
        "weights_id": args.weights_id or "bf16",
        "kv_dtype": args.kv_dtype,
        "cuda_graph": not args.no_cuda_graph and torch.cuda.is_available(),
        "overlap": args.overlap,
    }
    try:
        import triton

        result["software"]["triton"] = triton.__version__
        import fla

        result["software"]["fla"] = getattr(fla, "__version__", "?")
    except ImportError:
        pass
    return result


def bench_server(args: argparse.Namespace) -> dict[str, Any]:
    """``--server``: the header, ``server_setup`` and the ``server`` rows (server.py)."""
    result = _header(args)
    got = server_bench(args, _log)
    result["server_setup"], result["server"] = got["setup"], got["rows"]
    _log("engine step vs client (ninfer-serve + openai SDK, streamed):\n" + server_table(got["rows"]))
    return result


def bench(args: argparse.Namespace) -> dict[str, Any]:
    config = GEOMETRIES[args.synthetic]
    result = _header(args)
    limits = measure_limits()
    result["limits"] = {k: round(v, 1) for k, v in limits.items()}
    _log(f"limits: {result['limits']}")
    if args.weights_id is not None:
        model = build_synthetic_quantized(config, args.weights_id)
    else:
        model = build_synthetic(config, with_mtp=args.spec_rounds > 0 and args.spec == "mtp")
    if args.spec_rounds and args.spec == "dflash":
        attach_dflash(model, random_dflash(PUBLISHED_35B_A3B, device="cuda", dtype=torch.bfloat16))
    weights = weight_bytes(model)
    result["weights_GB"] = {k: round(v / 1e9, 3) for k, v in weights.items() if not k.startswith("params")}
    result["expert_scratch_GB"] = round(scratch_bytes(model) / 1e9, 3)  # quantized experts' prefill banks
    _log(f"built {args.synthetic} ({result['weights_id']}): {result['weights_GB']} GB"
         f" + expert scratch {result['expert_scratch_GB']} GB")  # fmt: skip

    bandwidth = limits["read_GBps"] * 1e9
    flop_rate = limits["bf16_matmul_TFLOPs"] * 1e12

    if not args.skip_prefill:
        longest = max(args.prompt_len)
        runner = make_runner(model, -(-longest // PAGE_SIZE) + 1, 2, args.kv_dtype, False, longest)
        rows = []
        for length in args.prompt_len:
            run_prefill(runner, config.vocab_size, length, args.prefill_chunk)  # warm-up: compiles, autotunes
            times = [run_prefill(runner, config.vocab_size, length, args.prefill_chunk)
                     for _ in range(args.prefill_runs)]  # fmt: skip
            seconds = statistics.median(times)
            limit = flop_rate / prefill_flops_per_token(config, weights, length)
            row = {"prompt_len": length, "chunk": args.prefill_chunk, "seconds": round_sig(seconds),
                   "tok_s": round(length / seconds, 1), "limit_tok_s": round(limit, 1),
                   "fraction_of_limit": round(length / seconds / limit, 3),
                   "runs_s": [round_sig(t) for t in times]}  # fmt: skip
            _log(f"prefill {row}")
            rows.append(row)
        result["prefill"] = rows
        if args.profile:
            length = args.prompt_len[0]
            result["profile_prefill"] = {
                "prompt_len": length,
                **profile_kernels(lambda: run_prefill(runner, config.vocab_size, length, args.prefill_chunk)),
            }
            _log(f"prefill profile: {result['profile_prefill']['by_category_ms']}")
        del runner
        gc.collect()
        torch.cuda.empty_cache()

    if not args.skip_decode:
        max_c = max(args.concurrency)
        steps_budget = args.decode_warmup + max(args.decode_tokens, args.eager_decode_tokens) + 1
        max_context = args.decode_context + steps_budget
        pages = max_c * -(-max_context // PAGE_SIZE) + 1
        rows = []
        for graphs in (False,) if args.no_cuda_graph else (True, False):
            steps = args.decode_tokens if graphs or args.no_cuda_graph else args.eager_decode_tokens
            if steps <= 0:
                continue
            t0 = time.perf_counter()
            runner = make_runner(model, pages, max_c + 1, args.kv_dtype, graphs, max_context)
            if graphs:
                result["graph_capture_s"] = round(time.perf_counter() - t0, 2)
            for c in args.concurrency:
                per_step = run_decode(
                    runner, config.vocab_size, c, args.decode_context, args.decode_warmup, steps, args.overlap
                )
                nbytes = decode_step_bytes(
                    config, weights, c, args.decode_context + steps // 2, args.kv_dtype
                )
                limit = c * bandwidth / nbytes
                row = {"concurrency": c, "cuda_graph": graphs and runner.graphs_captured, "overlap": args.overlap,
                       "context": args.decode_context, "steps": steps, "step_ms": round(per_step * 1e3, 3),
                       "tok_s": round(c / per_step, 1), "bytes_per_step_GB": round(nbytes / 1e9, 3),
                       "limit_tok_s": round(limit, 1), "fraction_of_limit": round(c / per_step / limit, 3)}  # fmt: skip
                _log(f"decode {row}")
                rows.append(row)
            if args.profile and not graphs:
                result["profile_decode_eager_c1"] = profile_kernels(
                    lambda r=runner: run_decode(r, config.vocab_size, 1, args.decode_context, 0, 1)
                )
                _log(f"decode profile: {result['profile_decode_eager_c1']['by_category_ms']}")
            del runner
            gc.collect()
            torch.cuda.empty_cache()
        result["decode"] = rows

    if args.spec_rounds:
        result["spec"] = _bench_spec(model, config.vocab_size, args, result.get("decode", ()))

    if args.gpu_memory_limit is not None:  # last: the speed rows above survive whatever happens here
        try:
            cap = apply_memory_limit(
                EngineConfig(gpu_memory_limit=args.gpu_memory_limit), torch.device("cuda")
            )
            assert cap is not None
            result["fit"] = fit_report(model, cap, args.kv_dtype, args.prefill_chunk, _log)
        except Exception as exc:  # noqa: BLE001 - recorded in the JSON, the run's other results kept
            result["fit"] = {"error": f"{type(exc).__name__}: {exc}"}
        finally:
            torch.cuda.set_per_process_memory_fraction(1.0)
        _log(f"fit under {args.gpu_memory_limit} GiB: {result['fit']}")

    if args.vs_hf:
        del model  # 27B is ~54 GB in bf16: ours goes before HF's is built
        gc.collect()
        torch.cuda.empty_cache()
        result["hf"] = time_hf(
            config,
            prompt_lens=() if args.skip_prefill else args.prompt_len,
            max_prompt_len=args.hf_max_prompt_len,
            prefill_runs=args.prefill_runs,
            concurrency=() if args.skip_decode else (args.hf_concurrency or args.concurrency),
            decode_context=args.decode_context,
            decode_tokens=args.decode_tokens,
            decode_warmup=args.decode_warmup,
            attn_implementation=args.hf_attn_implementation,
            log=_log,
        )
        add_speedups(result["hf"], result.get("prefill", ()), result.get("decode", ()))
        for kind in ("prefill", "decode"):
            for row in result["hf"][kind]:
                _log(f"hf {kind} vs ours {row}")
    return result


def _bench_spec(
    model: Any, vocab: int, args: argparse.Namespace, decode: Sequence[dict[str, Any]]
) -> list[Any]:
    """Per concurrency: one speculative round's time vs the plain decode step measured above (graph and
    eager), and the projected time per output token at ACCEPTANCE_LENGTH tokens per round."""
    k, max_c = args.spec_rounds, max(args.concurrency)
    if args.spec_lm_head_draft:
        attach_random_draft_head(model)
    max_context = args.decode_context + (args.decode_warmup + args.decode_tokens + 2) * (k + 1)
    runner = make_spec_runner(
        model,
        max_c * -(-max_context // PAGE_SIZE) + 1,
        max_c,
        args.kv_dtype,
        k,
        max_context,
        cuda_graph=not args.no_cuda_graph,
        spec=args.spec,
    )
    if runner.spec is not None:
        runner.spec.one_wait = not args.spec_two_waits
    length = DFLASH_ACCEPTANCE_LENGTH if args.spec == "dflash" else ACCEPTANCE_LENGTH
    params = default_sampling(moe=False, thinking=False) if args.spec_sampled else GREEDY
    warmup = (
        max(args.decode_warmup, 1) if args.spec_sampled else args.decode_warmup
    )  # sampled: a width-1 first step
    rows = []
    for c in args.concurrency:
        one_wait_before = runner.spec.num_one_wait_rounds if runner.spec is not None else 0
        got = run_spec_rounds(runner, vocab, c, args.decode_context, warmup, args.decode_tokens, k, params)
        plain = {
            ("graph" if r["cuda_graph"] else "eager"): r["step_ms"] for r in decode if r["concurrency"] == c
        }
        round_ms = got["round_s"] * 1e3
        row = {"spec": args.spec, "concurrency": c, "draft_tokens": k, "round_ms": round(round_ms, 3),
               "sampled": bool(args.spec_sampled),
               "lm_head_draft": bool(args.spec_lm_head_draft),
               "spec_cuda_graph": runner.spec_graphs_captured,
               "spec_graphs": runner.spec.capture_reports() if runner.spec is not None else {},
               "graph_replays_per_round": got["graph_replays_per_round"],
               "one_wait_rounds": (runner.spec.num_one_wait_rounds if runner.spec is not None else 0) - one_wait_before,
               "tokens_per_round_random_weights": round(got["tokens_per_round"], 3),
               "plain_step_ms": plain, "round_over_plain": {m: round(round_ms / v, 3) for m, v in plain.items()},
               f"projected_tpot_ms_at_{length}": round(round_ms / length, 3),
               f"projected_tok_s_at_{length}": round(c * length / got["round_s"], 1)}  # fmt: skip
        if args.profile and c == min(args.concurrency):
            rounds = functools.partial(
                run_spec_rounds,
                runner,
                vocab,
                c,
                args.decode_context,
                int(args.spec_sampled),
                PROFILED_ROUNDS,
                k,
                params,
            )
            prof = profile_kernels(rounds)
            row["profile_rounds"] = {"rounds": PROFILED_ROUNDS, **prof,
                                     "kernel_ms_per_round": round(prof["kernel_ms_total"] / PROFILED_ROUNDS, 3)}  # fmt: skip
            _log(f"spec profile: {row['profile_rounds']['kernel_ms_per_round']} kernel ms a round, "
                 f"{prof['by_category_ms']}")  # fmt: skip
        _log(f"spec {row}")
        rows.append(row)
    del runner
    gc.collect()
    torch.cuda.empty_cache()
    return rows


def _check_server_args(args: argparse.Namespace) -> None:
    if args.vs_hf or args.spec_rounds or args.gpu_memory_limit is not None or args.profile:
        raise ValueError("--server runs alone: drop --vs-hf, --spec-rounds, --gpu-memory-limit and --profile")
    if args.server_prompt_len < 8 or args.server_max_tokens < 2:
        raise ValueError("--server needs --server-prompt-len >= 8 and --server-max-tokens >= 2")
    try:
        import openai  # noqa: F401
    except ImportError as exc:
        raise ValueError(f"--server drives the server with the official openai SDK: {exc}") from None


def check_args(args: argparse.Namespace) -> str | None:
    """The reason ``args`` cannot run (the rules that need no device: also what a device plan's tests check on
    the CPU), or None."""
    try:
        if args.server:
            _check_server_args(args)
        elif not needs_cuda(args.synthetic):
            raise ValueError(f"--synthetic {args.synthetic} is for --server runs (its CPU test) only")
        if args.weights_id is not None:
            synthetic_profile(args.weights_id, synthetic_config(args.synthetic))
            if args.spec_rounds and args.spec == "mtp":
                raise ValueError(
                    "--spec-rounds needs dense weights: quantized synthetic weights carry no MTP head"
                )
        if args.spec_rounds:
            # K within the method's range; a reduced proposal head only with MTP (the engine's own rules)
            EngineConfig(spec=args.spec, draft_tokens=args.spec_rounds, lm_head_draft=args.spec_lm_head_draft)
            if args.spec == "dflash":
                geometry = synthetic_config(args.synthetic)
                check_target(PUBLISHED_35B_A3B, geometry.hidden_size, geometry.num_hidden_layers,
                             geometry.is_moe, geometry.vocab_size)  # fmt: skip
        if args.gpu_memory_limit is not None:
            EngineConfig(gpu_memory_limit=args.gpu_memory_limit)
    except ValueError as exc:
        return str(exc)
    return None


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    reason = check_args(args)
    if reason is not None:
        print(f"ninfer-bench: {reason}", file=sys.stderr)
        return 2
    if not torch.cuda.is_available() and needs_cuda(args.synthetic):
        print(
            "ninfer-bench: needs a CUDA device (the synthetic geometries are built on the GPU)",
            file=sys.stderr,
        )
        return 2
    if args.vs_hf:
        try:
            from transformers import Qwen3_5ForCausalLM, Qwen3_5MoeForCausalLM  # noqa: F401
        except ImportError as exc:
            print(f"ninfer-bench: --vs-hf needs transformers with the qwen3_5 models: {exc}", file=sys.stderr)
            return 2
    result = bench_server(args) if args.server else bench(args)
    text = json.dumps(result, indent=1)
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
