"""Shared pieces for the engine tests that run the real model: tiny artifacts, loaded once per process.

The tiny dense and MoE artifacts (engine.testing.tiny, real Qwen3.5 tokenizer) are built into a
temporary directory on first use and loaded in float32 on the CPU. A loaded model holds only weights
(caches belong to each runner), so every test shares one model per architecture.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import functools
import shutil
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch

from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.request import FinishEvent, SamplingParams, TokenEvent
from engine.testing.tiny import build_tiny

GREEDY = SamplingParams(temperature=0.0, max_tokens=6)


@functools.cache
def _root() -> Path:
    root = Path(tempfile.mkdtemp(prefix="ninfer-engine-tests-"))
    atexit.register(shutil.rmtree, root, ignore_errors=True)
    return root


@functools.cache
def tiny_artifact(arch: str) -> Path:
    return build_tiny(_root() / f"tiny-{arch}.ninfer", arch=arch, seed=0)


@functools.cache
def tiny_loaded(arch: str) -> Any:
    return load_artifact(tiny_artifact(arch), device="cpu", dtype=torch.float32)


def make_core(arch: str = "dense", seed: int | None = None, **flags: Any) -> EngineCore:
    """An EngineCore on the shared tiny model; flags as `EngineConfig.from_flags` takes them."""
    flags.setdefault("max_context", 512)
    flags.setdefault("prefill_chunk_multiple", 1)  # the tiny model's tests chunk at a few tokens
    loaded = tiny_loaded(arch)
    return EngineCore(loaded.model, loaded.tokenizer, EngineConfig.from_flags(**flags), seed=seed)


def prompt(n: int, seed: int) -> list[int]:
    """n token ids from the ordinary (non-special) part of the vocabulary."""
    return torch.randint(1000, 150_000, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def run(
    core: EngineCore,
    prompts: Sequence[Sequence[int]],
    params: SamplingParams = GREEDY,
    checkpoints: Sequence[Sequence[int]] | None = None,
    *,
    check: bool = True,
) -> tuple[list[list[int]], dict[str, FinishEvent]]:
    """Submit all prompts at once, step to completion (checking integrity after every step)."""
    ids = [f"r{core.num_requests_added + i}" for i in range(len(prompts))]
    tokens: dict[str, list[int]] = {i: [] for i in ids}
    finish: dict[str, FinishEvent] = {}
    for k, (request_id, ids_k) in enumerate(zip(ids, prompts, strict=True)):
        rejection = core.add_request(request_id, ids_k, params, checkpoints[k] if checkpoints else ())
        assert rejection is None, rejection
    while core.has_work():
        for event in core.step():
            if isinstance(event, TokenEvent):
                tokens[event.request_id].extend(event.token_ids)
            else:
                finish[event.request_id] = event
        if check:
            core.check_integrity()
    return [tokens[i] for i in ids], finish


def alone(arch: str, prompts: Sequence[Sequence[int]], params: SamplingParams = GREEDY, **flags: Any) -> list:
    """Each prompt's tokens run on its own, in a fresh engine without prefix reuse."""
    out = []
    for p in prompts:
        core = make_core(arch, prefix_reuse=False, **flags)
        out.append(run(core, [p], params)[0][0])
    return out


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """One intra-op thread: the tiny model's ops are too small to gain from two, and on a shared
    2-core machine a busy second core makes OpenMP barriers spin (10-50x slower steps)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def agreeing_drafts(spec: Any, truth: dict[str, list[int]]) -> None:
    """Make every round of `spec` (a `SpecExecutor`: the general round and the one-wait rounds alike) propose the
    true continuation `truth[request_id]` (7 past its end) in place of its drafter's drafts."""
    real = spec.run

    def run_step(rows: Any, history: dict[str, list[int]], plain_sample: Any) -> Any:
        out = real(rows, history, plain_sample)
        drafts = list(out.drafts)
        for i, row in enumerate(rows):
            if drafts[i]:
                n = len(history[row.request_id])
                t = truth[row.request_id][n : n + len(drafts[i])]
                drafts[i] = tuple(t) + (7,) * (len(drafts[i]) - len(t))
        return dataclasses.replace(out, drafts=tuple(drafts))

    spec.run = run_step
