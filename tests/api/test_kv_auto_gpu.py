"""`--kv-capacity auto` on the H200: both real geometries (random weights) start, size their pool from
what is left after the model, state slots, graphs and a warm-up step, serve a request, and report it.

GPU only (marker `gpu`): `pytest -m gpu tests/api/test_kv_auto_gpu.py`.
"""

from __future__ import annotations

import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
import torch
from api_helpers import free_port, start_server, stop_server

from engine.runner.sizing import headroom_bytes

pytestmark = pytest.mark.gpu

MAX_CONTEXT = 32768


@pytest.mark.parametrize("geometry", ["qwen3.6-27b", "qwen3.6-35b-a3b"])
def test_kv_capacity_auto_starts_and_fills_the_memory_it_reports(tmp_path: Path, geometry: str) -> None:
    port = free_port()
    # the module, not the console script: the GPU machine runs the checkout from PYTHONPATH, uninstalled
    cmd = [sys.executable, "-m", "api.serve", "--synthetic", geometry, "--port", str(port),
           "--max-context", str(MAX_CONTEXT), "--max-concurrency", "8", "--kv-capacity", "auto",
           "--log-stats-interval-ms", "0"]  # fmt: skip
    url, process = start_server(cmd, tmp_path / "server.log", port, timeout=900.0)
    try:
        engine = httpx.get(f"{url}/stats", timeout=30).json()["engine"]
        num_pages, page_size = engine["num_pages"], engine["page_size"]
        assert num_pages * page_size > MAX_CONTEXT, f"auto sized only the minimum pool: {num_pages} pages"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=300)
        model = client.models.list().data[0].id
        replies = [
            client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": f"Count to {i}."}],
                max_tokens=64,
                temperature=0,
            )  # fmt: skip
            for i in range(3)
        ]
        assert all(r.usage is not None and r.usage.completion_tokens >= 1 for r in replies)
        # Filled: what the device has free with the server up is about the headroom (the server is in
        # another process; this one holds only a CUDA context).
        free, total = torch.cuda.mem_get_info()
        assert free < headroom_bytes(total) + 6 * 1024**3, f"{free / 1024**3:.1f} GiB left free"
        log = (tmp_path / "server.log").read_text()
        assert "kv-capacity auto:" in log
        print(f"{geometry}: {num_pages} pages x {page_size} tokens; {free / 1024**3:.1f} GiB free; "
              + next(line for line in log.splitlines() if "kv-capacity auto:" in line))  # fmt: skip
    finally:
        stop_server(process)


CAP_GIB = 32  # the RTX 5090 the operator places replicas on
LONG_CONTEXT = 131072
LANES = 4


def test_a_32_gib_cap_serves_a_long_context_on_four_lanes(tmp_path: Path) -> None:
    """#17's fit on the H200 emulating the RTX 5090: 27B groupwise-int, int8 KV, `--gpu-memory-limit 32` with
    `--kv-capacity auto` (measured within the cap). The pool holds a 131,072-token context, and four lanes at once
    (one ~126k-token prompt beside three of ~40k) prefill and decode under the cap without running out of memory."""
    port = free_port()
    cmd = [sys.executable, "-m", "api.serve", "--synthetic", "qwen3.6-27b", "--weights-id",
           "qwen3.6-27b/groupwise-int", "--kv-dtype", "int8", "--gpu-memory-limit", str(CAP_GIB),
           "--kv-capacity", "auto", "--max-context", str(LONG_CONTEXT), "--max-concurrency", str(LANES),
           "--port", str(port), "--log-stats-interval-ms", "0"]  # fmt: skip
    url, process = start_server(cmd, tmp_path / "server.log", port, timeout=900.0)
    try:
        engine = httpx.get(f"{url}/stats", timeout=30).json()["engine"]
        pool_tokens = engine["num_pages"] * engine["page_size"]
        assert pool_tokens >= LONG_CONTEXT, f"the capped pool holds {pool_tokens} tokens"
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0, timeout=600)
        model = client.models.list().data[0].id
        words = [126_000, 40_000, 40_000, 40_000]

        def ask(n: int) -> openai.types.chat.ChatCompletion:
            return client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hello " * n}],
                max_tokens=16,
                temperature=0,
            )

        with ThreadPoolExecutor(LANES) as pool:
            replies = list(pool.map(ask, words))
        for n, reply in zip(words, replies, strict=True):
            assert reply.usage is not None and reply.usage.prompt_tokens > n, reply.usage
            assert reply.usage.completion_tokens == 16 and reply.choices[0].finish_reason == "length"
        log = (tmp_path / "server.log").read_text()
        line = next(line for line in log.splitlines() if "kv-capacity auto:" in line)
        assert "cap" in line, line
        print(
            f"27B groupwise-int under {CAP_GIB} GiB: {engine['num_pages']} pages ({pool_tokens} tokens); {line}"
        )
    finally:
        stop_server(process)
