"""`ninfer-bench --server`: the engine's own decode step next to what a client of `ninfer-serve` sees.

One run, per concurrency C of ``--concurrency``:
1. engine: C rows decode through the ``ModelRunner`` in this process (steps.py's ``run_decode``, CUDA graphs
   unless ``--no-cuda-graph``, overlapped steps on a GPU unless ``--no-overlap``, as the server runs them) at the context the served requests average (prompt tokens + half of
   ``--server-max-tokens``); the step time is ``engine_step_ms``. The model is then freed.
2. server: ``ninfer-serve --synthetic`` on the same geometry and flags runs as a subprocess (``python -m
   api.serve``: the same interpreter and code as this process); once its ``/ready`` answers 200, one
   untimed round of C requests warms it, then C concurrent streaming Chat Completions through the official
   ``openai`` SDK (``AsyncOpenAI``), each a prompt of ``--server-prompt-len`` tokens (calibrated against the
   server's reported ``prompt_tokens``) asking for exactly ``--server-max-tokens`` tokens: ``ignore_eos``
   (our Chat Completions extension, vLLM's name) keeps generating through end-of-sequence tokens, so
   ``usage.completion_tokens`` equals ``max_tokens`` and ``finish_reason`` is ``length``.

What a row reports, per C (times from ``time.perf_counter`` around the SDK's stream):
- ``ttft_ms_mean`` / ``ttft_ms_p50``: request sent -> the first chunk carrying text;
- ``client_tpot_ms_mean``: over every request, (the finishing chunk's arrival - the first text chunk's
  arrival) / (completion tokens - 1), summed spans over summed tokens;
- ``client_tpot_ms_p50``: the median gap between successive chunks after the first text chunk (text
  chunks and the finishing chunk). A chunk carries one token unless a token's text is held back (a special
  token, a partial UTF-8 character) or the server batches ready tokens into one chunk; ``tokens_per_chunk``
  says how many tokens the chunks carried on average (1.0: the median is per token);
- ``loss_pct``: 100 * (client_tpot_ms_mean / engine_step_ms - 1), what serving adds to the engine step;
- ``client_tpot_ms_steady`` / ``loss_pct_steady``: the same over the steady window only (every request has its
  first token and none has finished: each step decodes all C rows with no prefill beside them, the condition
  the engine step is timed in), the mean chunk gap there over ``tokens_per_chunk``; null when the window holds
  no gap (a round too short for one);
- ``client_tok_s``: completion tokens of the round / the round's wall time;
- ``prefill_steps`` / ``mixed_steps`` / ``burst_holds`` / ``burst_timeouts``: the server's ``/stats`` counters over
  the timed round (``num_prefill_steps``, ...): a burst admitted together is one prefill step and no mixed step
  (prompts within ``--prefill-chunk`` together; the server's ``--burst-wait-ms`` hold, which a timeout says ran
  out before every request of the burst had arrived).
The server runs with prefix reuse off (every request's prefill is cold; the prompts are the same text) and
thinking off; its log is ``--server-log`` (default: a temporary file, its tail printed on failure).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import shlex
import statistics
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from engine.testing.bench.steps import PAGE_SIZE, make_runner, run_decode
from engine.testing.geometry import synthetic_model_id
from engine.testing.process import free_port, start_process, stop_process

_WORD = " hello"  # one token in the Qwen3.5 vocabulary; the calibration does not depend on it


@dataclass(frozen=True)
class RequestTiming:
    """One streamed request: seconds from sending to each chunk, and what the server counted."""

    ttft_s: float  # sent -> first chunk carrying text
    chunk_s: tuple[float, ...]  # sent -> each chunk after the first text chunk (text or finishing)
    prompt_tokens: int
    completion_tokens: int
    finish_reason: str | None
    sent_s: float = 0.0  # time.perf_counter() when it was sent (the round's requests share the clock)


# ---- the server process --------------------------------------------------------------------------


def server_max_context(prompt_len: int, max_tokens: int) -> int:
    """The server's --max-context: the prompt (with chat-template slack), the output, rounded up to pages."""
    need = prompt_len + max_tokens + 64
    return -(-need // PAGE_SIZE) * PAGE_SIZE


def server_command(args: argparse.Namespace, port: int) -> list[str]:
    """``ninfer-serve`` on ``args``' geometry and engine flags, enough lanes and KV for the largest C."""
    max_c = max(args.concurrency)
    max_context = server_max_context(args.server_prompt_len, args.server_max_tokens)
    cmd = [
        sys.executable, "-m", "api.serve", "--synthetic", args.synthetic,
        "--host", "127.0.0.1", "--port", str(port),
        "--kv-dtype", args.kv_dtype, "--max-concurrency", str(max_c),
        "--max-context", str(max_context), "--kv-capacity", str(max_c * max_context),
        "--no-prefix-reuse", "--no-thinking", "--log-stats-interval-ms", "0", "--log-level", "warning",
    ]  # fmt: skip
    if args.weights_id is not None:
        cmd += ["--weights-id", args.weights_id]
    if args.no_cuda_graph:
        cmd.append("--no-cuda-graph")
    overlap = (
        args.overlap and torch.cuda.is_available()
    )  # as the engine steps are timed (the server's default: off)
    cmd.append("--overlap" if overlap else "--no-overlap")
    return cmd + shlex.split(args.server_args or "")


# ---- the client ------------------------------------------------------------------------------------


async def _stream_one(client: Any, model: str, content: str, max_tokens: int) -> RequestTiming:
    sent = time.perf_counter()
    stream = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": content}],
        max_tokens=max_tokens,
        temperature=0.0,
        stream=True,
        stream_options={"include_usage": True},
        extra_body={"ignore_eos": True},
    )
    first: float | None = None
    after: list[float] = []
    usage, finish = None, None
    async for chunk in stream:
        now = time.perf_counter() - sent
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            delta = choice.delta
            text = delta.content or getattr(delta, "reasoning_content", None)
            if text and first is None:
                first = now
            elif first is not None and (text or choice.finish_reason):
                after.append(now)
            finish = choice.finish_reason or finish
    if usage is None:
        raise RuntimeError("the stream carried no usage chunk (stream_options.include_usage)")
    if first is None:
        raise RuntimeError(f"no text in {usage.completion_tokens} streamed tokens")
    return RequestTiming(first, tuple(after), usage.prompt_tokens, usage.completion_tokens, finish, sent)


async def run_round(base_url: str, model: str, content: str, concurrency: int, max_tokens: int) -> tuple[
    list[RequestTiming], float
]:  # fmt: skip
    """``concurrency`` requests sent together; their timings and the round's wall seconds."""
    from openai import AsyncOpenAI

    async with AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600.0) as client:
        start = time.perf_counter()
        timings = await asyncio.gather(
            *(_stream_one(client, model, content, max_tokens) for _ in range(concurrency))
        )
        return list(timings), time.perf_counter() - start


def calibrate_prompt(base_url: str, model: str, target: int) -> tuple[str, int]:
    """User text whose chat prompt is ``target`` tokens (or the nearest the template allows), and that count:
    two probes give the template's overhead and the tokens a word adds."""

    def count(words: int) -> int:
        timings, _ = asyncio.run(run_round(base_url, model, _WORD * words, 1, 1))
        return timings[0].prompt_tokens

    base, more = count(1), count(9)
    per_word = max(1.0, (more - base) / 8)
    words = max(1, 1 + round((target - base) / per_word))
    got = count(words)
    for _ in range(3):  # a word at a boundary may merge: settle on the exact count
        if got == target:
            break
        words = max(1, words + round((target - got) / per_word))
        got = count(words)
    return _WORD * words, got


def summarize(timings: Sequence[RequestTiming], wall_s: float, engine_step_ms: float) -> dict[str, Any]:
    """One row: TTFT, client TPOT (mean, p50), the loss against the engine step, token counts."""
    spans = [t.chunk_s[-1] - t.ttft_s for t in timings if t.chunk_s]
    tokens_after_first = sum(t.completion_tokens - 1 for t in timings)
    gaps = []
    for t in timings:
        marks = (t.ttft_s, *t.chunk_s)
        gaps += [b - a for a, b in zip(marks, marks[1:], strict=False)]
    tpot_mean_ms = 1e3 * sum(spans) / tokens_after_first
    ttfts = [1e3 * t.ttft_s for t in timings]
    # steady state: from the moment every request has its first token to the first one's last chunk, each
    # step decodes all C rows and no prefill shares it (the engine step's own condition)
    begin = max(t.sent_s + t.ttft_s for t in timings)
    end = min(t.sent_s + (t.chunk_s[-1] if t.chunk_s else t.ttft_s) for t in timings)
    steady = []
    for t in timings:
        at = [t.sent_s + x for x in (t.ttft_s, *t.chunk_s)]
        steady += [b - a for a, b in zip(at, at[1:], strict=False) if a >= begin and b <= end]
    tokens_per_chunk = tokens_after_first / max(1, len(gaps))
    steady_ms = 1e3 * statistics.fmean(steady) / tokens_per_chunk if steady else None
    return {
        "concurrency": len(timings),
        "prompt_tokens": sorted({t.prompt_tokens for t in timings}),
        "completion_tokens": sorted({t.completion_tokens for t in timings}),
        "finish_reasons": sorted({str(t.finish_reason) for t in timings}),
        "engine_step_ms": round(engine_step_ms, 3),
        "client_tpot_ms_mean": round(tpot_mean_ms, 3),
        "client_tpot_ms_p50": round(1e3 * statistics.median(gaps), 3),
        "tokens_per_chunk": round(tokens_per_chunk, 3),
        "client_tpot_ms_steady": None if steady_ms is None else round(steady_ms, 3),
        "steady_gaps": len(steady),
        "ttft_ms_mean": round(statistics.fmean(ttfts), 2),
        "ttft_ms_p50": round(statistics.median(ttfts), 2),
        "loss_pct": round(100.0 * (tpot_mean_ms / engine_step_ms - 1.0), 1),
        "loss_pct_steady": None
        if steady_ms is None
        else round(100.0 * (steady_ms / engine_step_ms - 1.0), 1),
        "client_tok_s": round(sum(t.completion_tokens for t in timings) / wall_s, 1),
        "wall_s": round(wall_s, 3),
    }


# ---- the run ---------------------------------------------------------------------------------------


def engine_steps(args: argparse.Namespace, context: int, log: Callable[[str], None]) -> dict[int, float]:
    """Per concurrency: seconds of one engine decode step at ``context`` cached tokens (this process); the
    model and runner are freed before returning, so the server gets the memory."""
    from engine.testing.synthetic import load_synthetic

    model, _, _ = load_synthetic(args.synthetic, weights_id=args.weights_id)
    vocab = model.config.vocab_size
    max_c = max(args.concurrency)
    max_context = context + args.decode_warmup + args.decode_tokens + 1
    pages = max_c * -(-max_context // PAGE_SIZE) + 1
    graphs = not args.no_cuda_graph and torch.cuda.is_available()
    runner = make_runner(model, pages, max_c + 1, args.kv_dtype, graphs, max_context)
    overlap = args.overlap and torch.cuda.is_available()  # as the server started with --overlap
    steps = {}
    for c in args.concurrency:
        steps[c] = run_decode(runner, vocab, c, context, args.decode_warmup, args.decode_tokens, overlap)
        log(f"engine decode C={c} context={context}: {steps[c] * 1e3:.3f} ms/step")
    del runner, model
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return steps


_ROUND_COUNTERS = (
    ("num_prefill_steps", "prefill_steps"),
    ("num_mixed_steps", "mixed_steps"),
    ("num_burst_holds", "burst_holds"),
    ("num_burst_timeouts", "burst_timeouts"),
)


def engine_counters(url: str) -> dict[str, int]:
    """The server's ``/stats`` engine counters a round reports (0 where the server has none)."""
    with urllib.request.urlopen(f"{url}/stats", timeout=30) as response:
        engine = json.load(response)["engine"]
    return {key: int(engine.get(key, 0)) for key, _ in _ROUND_COUNTERS}


def bench_server(args: argparse.Namespace, log: Callable[[str], None]) -> dict[str, Any]:
    """The engine steps, then the server rounds; ``{"setup": ..., "rows": [...]}``."""
    context = args.server_prompt_len + args.server_max_tokens // 2
    steps = engine_steps(args, context, log)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = server_command(args, port)
    log_path = args.server_log or Path(tempfile.mkdtemp(prefix="ninfer-bench-")) / "server.log"
    log(f"starting {' '.join(cmd)} (log: {log_path})")
    started = time.perf_counter()
    process = start_process(cmd, log_path, url, timeout=args.server_timeout, probe="/ready")
    setup: dict[str, Any] = {"server_command": cmd[1:], "ready_s": round(time.perf_counter() - started, 1),
                             "engine_context": context, "max_tokens": args.server_max_tokens}  # fmt: skip
    rows = []
    try:
        model = synthetic_model_id(args.synthetic)
        content, prompt_tokens = calibrate_prompt(f"{url}/v1", model, args.server_prompt_len)
        setup["prompt_tokens"] = prompt_tokens
        log(f"prompt: {prompt_tokens} tokens (asked {args.server_prompt_len})")
        for c in args.concurrency:
            asyncio.run(run_round(f"{url}/v1", model, content, c, min(8, args.server_max_tokens)))  # warm-up
            before = engine_counters(url)
            timings, wall = asyncio.run(run_round(f"{url}/v1", model, content, c, args.server_max_tokens))
            after = engine_counters(url)
            row = summarize(timings, wall, steps[c] * 1e3)
            row |= {name: after[key] - before[key] for key, name in _ROUND_COUNTERS}
            log(f"server {row}")
            rows.append(row)
    finally:
        stop_process(process)
    return {"setup": setup, "rows": rows}


def table(rows: Sequence[dict[str, Any]]) -> str:
    """The rows as a Markdown table (the issue's shape: engine step, client TPOT, loss)."""
    head = (
        "| C | engine step ms | client TPOT ms (mean / p50 / steady) | TTFT ms (mean / p50) | loss (steady)"
        " | client tok/s | prefill / mixed steps |"
    )
    lines = [head, "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(
            f"| {r['concurrency']} | {r['engine_step_ms']} | {r['client_tpot_ms_mean']} / {r['client_tpot_ms_p50']}"
            f" / {r['client_tpot_ms_steady']} | {r['ttft_ms_mean']} / {r['ttft_ms_p50']} | {r['loss_pct']}%"
            f" ({r['loss_pct_steady']}%) | {r['client_tok_s']} | {r.get('prefill_steps')} / {r.get('mixed_steps')} |"
        )
    return "\n".join(lines)
