"""A greedy speculative round (verify, roll back, catch up, draft) waits for the device once on the one-wait path
(engine/runner/spec_round.py: accepted counts, bonus tokens and drafts in one copy) and twice on the general one:
the verdict's host copy (engine/spec/verify.py) and the drafts' (engine/spec/mtp.py); a sampled, penalized round
(the server's preset) once on the sampled one-wait path (engine/runner/spec_sampled.py), 2 + K times on the general
one (the verdict's two copies, one per draft); with `--spec dflash` once on either one-wait path
(engine/runner/dflash_round.py), greedy twice and sampled three times on the general one (the block's K drafts are
one copy). Every other value the round sends to the device
goes up through `engine.transfer.upload` (pinned, non-blocking): no `torch.tensor(..., device=...)`, no tensor
indexed with a host list (both copy with a stream sync on CUDA), and no other `.tolist()` / `.item()` / `.cpu()`.

Counted on the CPU by patching those calls and attributing each to the innermost engine frame that made it
(the kernels' torch references, which the CPU runs in place of the Triton launchers, are not counted: on CUDA
their launchers run instead).
"""

from __future__ import annotations

import collections
import functools
import sys
from collections.abc import Iterator
from types import FrameType
from typing import Any

import pytest
import torch
from engine_harness import one_thread, tiny_artifact
from torch.overrides import TorchFunctionMode

from engine.core import load_artifact
from engine.request import SamplingParams
from engine.testing.bench.spec import make_spec_runner, run_spec_rounds

ROUNDS = 3


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@functools.cache
def _model(arch: str) -> Any:
    return load_artifact(tiny_artifact(arch), device="cpu", dtype=torch.float32, with_mtp=True).model


def _caller() -> str:
    """`engine/...py:function` of the innermost engine or kernels frame ("" for kernels and for the bench loop in
    engine/testing, which builds its random first tokens on the host)."""
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename
        if "/engine/" in path or "/kernels/" in path:
            if "/kernels/" in path or "/engine/testing/" in path:
                return ""
            return f"engine/{path.split('/engine/')[-1]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return ""


_READS = {torch.Tensor.tolist: "tolist", torch.Tensor.item: "item", torch.Tensor.cpu: "cpu"}


class _SyncCounter(TorchFunctionMode):
    """Counts, by caller, the host reads of the round (`.tolist()`, `.item()`, `.cpu()`) and indexing with a host
    list. A torch-function mode, not a patch of torch.Tensor's methods: assigning `__getitem__` on the class
    changes its C slots for good (HF's Qwen3.5 vision rope indexing then failed with "len() of a 0-d tensor" in
    tests that ran after this one in the same process)."""

    def __init__(self, counts: collections.Counter[str]) -> None:
        super().__init__()
        self.counts = counts

    def __torch_function__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        name = _READS.get(func)
        if name is None and func is torch.Tensor.__getitem__ and isinstance(args[1], list):
            name = "tensor[list]"
        if name is not None:
            where = _caller()
            if where:
                self.counts[f"{name} {where}"] += 1
        return func(*args, **(kwargs or {}))


def _count_syncs(monkeypatch: pytest.MonkeyPatch) -> tuple[collections.Counter[str], _SyncCounter]:
    """The counts and the mode to run the rounds under (torch.tensor(device=) is counted through monkeypatch)."""
    counts: collections.Counter[str] = collections.Counter()
    real_tensor = torch.tensor

    def tensor(*args: Any, **kwargs: Any) -> torch.Tensor:
        where = _caller()
        if where and kwargs.get("device") is not None:
            counts[f"torch.tensor(device=) {where}"] += 1
        return real_tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", tensor)
    return counts, _SyncCounter(counts)


def _counted_rounds(
    runner: Any, k: int, concurrency: int, monkeypatch: pytest.MonkeyPatch
) -> collections.Counter[str]:
    """The host reads of ROUNDS greedy rounds through `runner` (after one round that first uses every shape)."""
    vocab, context = runner.config.vocab_size, 20
    run_spec_rounds(runner, vocab, concurrency, context, 0, 1, k)
    counts, mode = _count_syncs(monkeypatch)
    try:
        with mode:
            got = run_spec_rounds(runner, vocab, concurrency, context, 0, ROUNDS, k)
    finally:
        monkeypatch.undo()
    assert got["tokens_per_round"] >= 1
    return counts


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("one_wait", [True, False])
def test_a_greedy_round_waits_only_for_what_its_host_reads(
    arch: str, concurrency: int, one_wait: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    k = 3
    runner = make_spec_runner(_model(arch), 3 * concurrency, concurrency, "bf16", k, 64, cuda_graph=False)
    assert runner.spec is not None
    runner.spec.one_wait = one_wait
    counts = _counted_rounds(runner, k, concurrency, monkeypatch)
    want = {
        "tolist engine/spec/verify.py:verify": ROUNDS,
        "tolist engine/spec/mtp.py:_propose_on_device": ROUNDS,
    }
    if one_wait:
        want = {"tolist engine/runner/spec_round.py:run_one_wait": ROUNDS}
        assert runner.spec.num_one_wait_rounds == ROUNDS + 1
    assert dict(counts) == want


@pytest.mark.parametrize("concurrency", [1, 3])
@pytest.mark.parametrize("one_wait", [True, False])
def test_a_greedy_dflash_round_waits_once_or_twice(
    concurrency: int, one_wait: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--spec dflash`: the verify (with features), acceptance, rollback and the drafter's round (context-KV store,
    block, head) all queue on the device; the one copy of (accepted, bonus, drafts) is the round's only wait. The
    general round (its block on the same buffers) waits for the verdict and for the drafts."""
    from test_spec_dflash_engine import _loaded

    k = 4
    runner = make_spec_runner(
        _loaded().model, 3 * concurrency, concurrency, "bf16", k, 64, cuda_graph=False, spec="dflash"
    )
    assert runner.spec is not None and runner.spec.draft_graphs is not None
    runner.spec.one_wait = one_wait
    counts = _counted_rounds(runner, k, concurrency, monkeypatch)
    want = {
        "tolist engine/spec/verify.py:verify": ROUNDS,
        "tolist engine/spec/verify.py:draft_tokens": ROUNDS,
    }
    if one_wait:
        want = {"tolist engine/runner/dflash_round.py:run_dflash_one_wait": ROUNDS}
        assert runner.spec.num_one_wait_rounds == ROUNDS + 1
    assert dict(counts) == want
    assert runner.spec.draft_graphs.runs == ROUNDS + 1


SERVER_DEFAULT = SamplingParams(
    temperature=0.7, top_p=0.8, top_k=20, presence_penalty=1.5
)  # non-thinking preset


def _sampled_rounds(
    runner: Any, k: int, one_wait: bool, drafts_copies: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ROUNDS + 1 steps of 3 rows with the server's default sampling through `runner` (the sampled one-wait round on
    or off): the first step (a width-1 verify, whose drafts carry their q) takes the general round either way, which
    reads the verdict (the greedy tokens, then the rejection's), then the drafts in `drafts_copies` copies; a sampled
    one-wait round reads (accepted, bonus, drafts) once, in `finish_sampled` (engine/runner/spec_sampled.py)."""
    assert runner.spec is not None
    runner.spec.one_wait_sampled = one_wait
    counts, mode = _count_syncs(monkeypatch)
    try:
        with mode:
            got = run_spec_rounds(runner, runner.config.vocab_size, 3, 20, 0, ROUNDS + 1, k, SERVER_DEFAULT)
    finally:
        monkeypatch.undo()
    assert got["tokens_per_round"] >= 1
    general = {
        "tolist engine/spec/verify.py:verify": 1,
        "tolist engine/spec/verify.py:_rejection": 1,
        "tolist engine/spec/verify.py:draft_tokens": drafts_copies,
    }
    rounds = 1 if one_wait else ROUNDS + 1
    want = {name: n * rounds for name, n in general.items()}
    if one_wait:
        want["tolist engine/runner/spec_sampled.py:finish_sampled"] = ROUNDS
    assert dict(counts) == want
    assert runner.spec.num_sampled_one_wait_rounds == (ROUNDS if one_wait else 0)


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("one_wait", [True, False])
def test_a_sampled_penalized_round_waits_once_on_the_sampled_path(
    arch: str, one_wait: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The server's default sampling (temperature, top-p, top-k, a presence penalty): the sampled one-wait MTP round
    waits once; the general round 2 + K times (one copy per chained draft)."""
    k = 3
    runner = make_spec_runner(_model(arch), 9, 3, "bf16", k, 64, cuda_graph=False)
    _sampled_rounds(runner, k, one_wait, k, monkeypatch)


@pytest.mark.parametrize("one_wait", [True, False])
def test_a_sampled_penalized_dflash_round_waits_once_on_the_sampled_path(
    one_wait: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`--spec dflash` with the server's default sampling: the sampled one-wait round (engine/runner/dflash_round.py
    `run_dflash_sampled`: verify, rejection sampling, rollback, the drafter's block and its draws all on the device)
    waits once; the general round three times (the block's K drafts are one copy). Every block runs on the drafter's
    static buffers."""
    from test_spec_dflash_engine import _loaded

    k = 4
    runner = make_spec_runner(_loaded().model, 9, 3, "bf16", k, 64, cuda_graph=False, spec="dflash")
    assert runner.spec is not None and runner.spec.draft_graphs is not None
    _sampled_rounds(runner, k, one_wait, 1, monkeypatch)
    assert runner.spec.draft_graphs.runs == ROUNDS + 1
