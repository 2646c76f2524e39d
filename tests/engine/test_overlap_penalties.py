"""Presence / frequency penalties under overlap scheduling: the runner keeps each penalized request's output-token
counts on the device (engine/runner/penalties.py), so penalized rows overlap, and their streams equal the
synchronous engine's. The device counts are checked against the counts of the host history, mid-run (with a step
in flight), after a forced thinking close, and across release and reuse of a row.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest
import torch
from engine_harness import make_core, one_thread, prompt
from test_overlap import _summary, both, run_staggered

from engine.core import THINK_CLOSE, EngineCore
from engine.request import SamplingParams, TokenEvent
from engine.runner.penalties import PenaltyCounts
from engine.sampling import output_token_counts
from engine.step import PREVIOUS_TOKEN


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


PENALTIES = {"presence": {"presence_penalty": 1.5}, "frequency": {"frequency_penalty": 0.5}}


def _params(penalty: str, sampling: str, k: int, **extra: Any) -> SamplingParams:
    base = dict(max_tokens=6 + 2 * k, ignore_eos=True, **PENALTIES[penalty], **extra)
    if sampling == "greedy":
        return SamplingParams(temperature=0.0, **base)
    return SamplingParams(temperature=0.9, top_k=50, seed=300 + k, **base)


def _device_counts(core: EngineCore, request_id: str) -> torch.Tensor:
    penalties = core.runner.penalties
    assert penalties is not None and penalties.counts is not None
    row = penalties.row_of(request_id)
    assert row is not None, f"{request_id}: no penalty row"
    return penalties.counts[row]


def _in_flight(core: EngineCore) -> dict[str, list[int]]:
    """The tokens of the launched step not yet committed, by request (on the CPU they are already there)."""
    inflight = core._inflight
    if inflight is None:
        return {}
    sampling = [row.request_id for row in inflight.plan.rows if row.sample]
    return {rid: [token] for rid, token in zip(sampling, inflight.tokens(), strict=True)}


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("sampling", ["greedy", "seeded"])
@pytest.mark.parametrize("penalty", ["presence", "frequency"])
def test_penalized_streams_overlap_and_equal_the_synchronous_ones(
    arch: str, sampling: str, penalty: str
) -> None:
    """Staggered penalized requests (one also asks for logprobs, so its steps run synchronously while another
    request's token is still in flight): identical streams with overlap on and off, and steps overlap."""
    arrivals = [
        (0, prompt(5, 60), _params(penalty, sampling, 0)),
        (0, prompt(9, 61), _params(penalty, sampling, 1)),
        (3, prompt(4, 62), _params(penalty, sampling, 2, logprobs=1)),
        (6, prompt(7, 63), _params(penalty, sampling, 3)),
    ]
    sync, overlapped, core = both(arrivals, arch=arch, max_concurrency=3)
    assert _summary(overlapped) == _summary(sync)
    assert core.runner.num_overlapped_launches > 0
    assert core.runner.penalties is not None and core.runner.penalties.num_requests == 0, "every row released"


def test_penalties_steer_the_overlapped_stream() -> None:
    """The penalties are applied, from counts that are current on every overlapped step (else the equalities above
    could hold trivially: the tiny model's greedy streams repeat no token, so a positive penalty changes nothing).
    Negative penalties reward repeats: the stream locks onto one token, the same with overlap on and off."""
    ids = prompt(6, 70)
    plain = SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True)
    free = run_staggered(make_core(overlap=True), [(0, ids, plain)])[0]["q0"]
    assert len(set(free)) == len(free)
    rewarded = dataclasses.replace(plain, presence_penalty=-2.0, frequency_penalty=-2.0)
    sync, overlapped, core = both([(0, ids, rewarded)])
    assert _summary(overlapped) == _summary(sync)
    tokens = overlapped[0]["q0"]
    assert tokens[:2] == free[:2] and tokens[2:] == [tokens[1]] * 14, tokens
    assert core.runner.num_overlapped_launches > 10


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_device_counts_equal_the_counts_of_the_host_history_mid_run(arch: str) -> None:
    """With a step in flight: each live request's host history is its streamed tokens and a placeholder for the
    token in flight, and its device counts are those of the streamed tokens plus the one in flight."""
    core = make_core(arch, overlap=True, max_concurrency=3)
    params = [
        SamplingParams(temperature=0.0, max_tokens=30, presence_penalty=1.5),
        SamplingParams(temperature=0.8, seed=5, max_tokens=30, frequency_penalty=0.5),
        # logprobs: its steps run synchronously (while another row's token may be in flight) until it ends
        SamplingParams(
            temperature=0.0, max_tokens=4, presence_penalty=1.5, frequency_penalty=0.5, logprobs=1
        ),
    ]
    streamed: dict[str, list[int]] = {}
    for k, p in enumerate(params):
        assert (
            core.add_request(f"c{k}", prompt(5 + k, 80 + k), dataclasses.replace(p, ignore_eos=True)) is None
        )
    vocab = core.runner.config.vocab_size
    num_checked_in_flight = 0
    for step in range(14):
        for event in core.step():
            if isinstance(event, TokenEvent):
                streamed.setdefault(event.request_id, []).extend(event.token_ids)
        in_flight = _in_flight(core)
        for rid, tokens in streamed.items():
            if rid not in core.scheduler.requests:  # ended: its history and counts are released
                assert rid not in core.runner._output_token_ids and core.runner.penalties.row_of(rid) is None
                continue
            history = core.runner._output_token_ids[rid]
            want = tokens + in_flight.get(rid, [])
            assert history[: len(tokens)] == tokens, (step, rid)
            if rid in in_flight:
                assert history[len(tokens) :] == [PREVIOUS_TOKEN], (step, rid, "the in-flight token's place")
                num_checked_in_flight += 1
            else:
                assert history == tokens, (step, rid)
            expected = output_token_counts([want], vocab)[0]
            assert torch.equal(_device_counts(core, rid), expected), (step, rid)
    assert core.runner.num_overlapped_launches > 0 and num_checked_in_flight > 0 and len(streamed) == 3


def test_release_frees_rows_and_a_new_request_starts_from_zero() -> None:
    core = make_core("moe", overlap=True, max_concurrency=2)
    params = SamplingParams(temperature=0.0, max_tokens=5, presence_penalty=1.5, ignore_eos=True)
    tokens, _ = run_staggered(core, [(0, prompt(5, 90), params), (0, prompt(6, 91), params)])
    penalties = core.runner.penalties
    assert penalties is not None and penalties.num_requests == 0
    assert penalties.counts is not None and not penalties.counts.any(), "released rows are zeroed"
    capacity = penalties.capacity
    # a new request reuses a freed row; it counts only its own tokens
    assert core.add_request("later", prompt(7, 92), dataclasses.replace(params, max_tokens=20)) is None
    streamed: list[int] = []
    for _ in range(6):
        streamed += [t for e in core.step() if isinstance(e, TokenEvent) for t in e.token_ids]
    assert len(streamed) >= 3 and core._inflight is not None
    want = streamed + _in_flight(core)["later"]
    assert core.runner._output_token_ids["later"] == [*streamed, PREVIOUS_TOKEN]
    assert torch.equal(_device_counts(core, "later"), output_token_counts([want], penalties.vocab_size)[0])
    assert penalties.capacity == capacity and penalties.num_requests == 1
    core.abort("later")
    assert penalties.num_requests == 0 and penalties.row_of("later") is None


def test_penalty_counts_grow_by_doubling_and_keep_their_rows() -> None:
    counts = PenaltyCounts(vocab_size=10, device=torch.device("cpu"), initial_rows=2)
    zero = counts.gather([None])
    assert counts.capacity == 2 and not zero.any()
    names = [f"r{i}" for i in range(5)]
    for i, name in enumerate(names):  # one row each (row 0 is the zero row): 2 -> 4 -> 8 rows
        counts.gather([name])
        counts.add([name, None], torch.tensor([i, 9]))
    assert counts.capacity == 8 and counts.num_requests == 5
    got = counts.gather([*names, None])
    want = torch.zeros(6, 10)
    for i in range(5):
        want[i, i] = 1.0
    assert torch.equal(got, want), "the 9s of the None positions were counted nowhere"
    counts.adjust("r1", removed=[1], added=[3, 3])
    assert counts.gather(["r1"])[0].tolist() == [0, 0, 0, 2, 0, 0, 0, 0, 0, 0]
    row = counts.row_of("r2")
    counts.release(["r2", "never-seen"])
    assert counts.row_of("r2") is None and counts.num_requests == 4
    assert not counts.gather(["new"]).any() and counts.row_of("new") == row, "the freed row, zeroed"


def test_a_forced_thinking_close_fixes_the_device_counts() -> None:
    """The thinking budget replaces the 5th token with the template's close: the streams with penalties are the
    same with overlap on and off (a second, budget-free request overlaps beside it), and the budgeted request's
    device counts are those of its committed tokens (the replaced token out, the close's tokens in)."""
    tokenizer = make_core().tokenizer
    close = tokenizer.encode(THINK_CLOSE)
    opened = [*prompt(12, seed=3), tokenizer.special_ids.think_start_id]
    budgeted = SamplingParams(
        temperature=0.0, max_tokens=14, ignore_eos=True, presence_penalty=1.5, thinking_budget=4
    )
    plain = SamplingParams(temperature=0.7, seed=1, max_tokens=30, ignore_eos=True, frequency_penalty=0.5)
    arrivals = [(0, opened, budgeted), (0, prompt(8, 4), plain)]
    sync, overlapped, core = both(arrivals, prefix_reuse=False, max_concurrency=2)
    assert _summary(overlapped) == _summary(sync)
    tokens = overlapped[0]["q0"]
    assert tokens[4 : 4 + len(close)] == close and len(tokens) == 14
    assert core.runner.num_overlapped_launches > 0

    core = make_core(prefix_reuse=False, overlap=True)
    assert core.add_request("b", opened, dataclasses.replace(budgeted, max_tokens=30)) is None
    streamed: list[int] = []
    while len(streamed) < 4 + len(close) + 3:
        streamed += [t for e in core.step() if isinstance(e, TokenEvent) for t in e.token_ids]
    assert streamed[4 : 4 + len(close)] == close
    history = core.runner._output_token_ids["b"]
    assert history == streamed, "a budgeted request steps synchronously: its history is complete"
    assert torch.equal(
        _device_counts(core, "b"), output_token_counts([history], core.runner.config.vocab_size)[0]
    )


def test_warm_up_runs_the_penalty_path_and_leaves_no_row() -> None:
    core = make_core("moe")
    core.runner.warm_up(16)
    penalties = core.runner.penalties
    assert penalties is not None and penalties.capacity > 0, "the warm-up's sampled row is penalized"
    assert penalties.num_requests == 0 and penalties.counts is not None and not penalties.counts.any()


def test_penalized_streams_survive_preemption_and_host_parking() -> None:
    """A pool of one max_context for three lanes preempts and parks: a preempted request keeps its counts (rows are
    freed only when a request ends), so its resumed stream is the synchronous one. Negative penalties make the
    streams depend on the counts (they lock onto a repeated token)."""
    params = SamplingParams(
        temperature=0.0, max_tokens=14, ignore_eos=True, presence_penalty=-2.0, frequency_penalty=-2.0
    )
    arrivals = [(0, prompt(12, 20 + k), params) for k in range(3)]
    for flags in ({"prefix_reuse": False}, {"host_kv_cache_mib": 1}):
        sync, overlapped, core = both(
            arrivals, page_size=8, max_context=40, kv_capacity=40, max_concurrency=3, **flags
        )
        assert _summary(overlapped) == _summary(sync), flags
        assert core.stats().num_preemptions > 0 and core.runner.num_overlapped_launches > 0, flags
        assert all(len(set(tokens)) < len(tokens) for tokens in overlapped[0].values()), "the penalties steer"
