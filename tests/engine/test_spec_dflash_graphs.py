"""DFlash rounds through static buffers (engine/spec/dflash_graphs.py, engine/runner/dflash_round.py) on the CPU,
where they run the functions CUDA graphs capture, eagerly: greedy `--spec dflash` output equals plain decoding on
the tiny MoE (K 2 and 15, alone and batched) with its rounds on the static path; the one-wait static round and the
general round on the drafter's buffers equal the existing eager round round by round (committed tokens, accepted
and rolled-back counts, drafts, GDN state and the drafter's context KV before every frontier), seeded sampled runs
too; padding rows and positions write nothing but the sink; a captured key replays over the filled buffers; the
buckets and graph keys stay bounded. The replay itself is checked on the GPU (tests/engine/test_spec_dflash_gpu.py).
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch
from engine_harness import one_thread, prompt, run
from test_spec_dflash_engine import LENGTHS, _loaded, core
from test_spec_one_wait import PAGE, PROMPTS, Lanes

from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.spec.dflash_draft import DFlashDrafter
from engine.spec.dflash_graphs import MIN_BUCKET, DFlashGraphs, DraftRow, context_buckets
from engine.testing.bench.spec import make_spec_runner

# no penalties: the model's defaults carry a presence penalty, and penalized rows take the general round
GREEDY = SamplingParams(temperature=0.0, presence_penalty=0.0)


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


@pytest.mark.parametrize("k", [2, 15])
def test_greedy_dflash_on_the_static_path_equals_plain_alone_and_batched(k: int) -> None:
    params = SamplingParams(temperature=0.0, presence_penalty=0.0, max_tokens=17)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(None, prefix_reuse=False, max_concurrency=3), prompts, params)[0]
    for engine, todo in ((core(k), prompts[1:2]), (core(k, max_concurrency=3, prefill_chunk=16), prompts)):
        got = run(engine, todo, params)[0]
        assert got == (want[1:2] if len(todo) == 1 else want), k
        spec = engine.runner.spec
        assert spec is not None and spec.draft_graphs is not None and spec.graphs is not None
        assert spec.num_one_wait_rounds > 0 and spec.draft_graphs.runs >= spec.num_one_wait_rounds
        assert spec.graphs.runs["target"] > 0 and spec.num_graph_replays == 0  # the CPU: eager, same buffers


def dflash_runner(k: int, mode: str, num_pages: int, device: str = "cpu") -> ModelRunner:
    """mode "one_wait": the static round; "general": the general round on the static target buffers; "eager":
    the existing eager round (no static buffers); "graph": the static round with CUDA graphs (the GPU)."""
    model = _loaded().model if device == "cpu" else gpu_model()
    runner = make_spec_runner(model, len(PROMPTS) * num_pages, len(PROMPTS), "bf16", k, PAGE * num_pages,
                              cuda_graph=mode == "graph", spec="dflash")  # fmt: skip
    spec = runner.spec
    assert spec is not None
    spec.one_wait = mode in ("one_wait", "graph")
    if mode == "eager":
        spec.graphs = spec.draft_graphs = None
    return runner


def gpu_model():  # type: ignore[no-untyped-def]
    from test_spec_dflash_gpu import loaded

    return loaded().model


def context_kv(runner: ModelRunner, lanes: Lanes) -> list[torch.Tensor]:
    """The drafter's context KV of every row's positions before its frontier, per layer K then V."""
    spec = runner.spec
    assert spec is not None and isinstance(spec.drafter, DFlashDrafter)
    slots = torch.tensor([
        pages[p // PAGE] * PAGE + p % PAGE for pages, end in zip(lanes.pages, lanes.pos, strict=True)
        for p in range(end)
    ])  # fmt: skip
    kv = spec.drafter.kv
    return [t[slots.to(t.device)].float().cpu() for t in (*kv.keys, *kv.values)]


def compare_rounds(k: int, modes: tuple[str, str], device: str = "cpu", rounds: int = 5) -> set[int]:
    """Rounds of drafts agreeing up to draft (i + r) % (k + 1) through two runners: the same tokens, counts,
    drafts, GDN working state and context KV after every round. Returns the accepted counts seen."""
    num_pages = 3
    truth = Lanes(dflash_runner(k, "eager", num_pages, device), num_pages=num_pages)
    while min(len(o) for o in truth.out) < rounds * (k + 1) + 1:
        truth.round(truth.drafts)
    want = truth.out
    lanes = {mode: Lanes(dflash_runner(k, mode, num_pages, device), num_pages=num_pages) for mode in modes}
    seen: set[int] = set()
    for r in range(rounds):
        results = {mode: lane.round(lane.mixed_drafts(want, k, r)) for mode, lane in lanes.items()}
        a, b = (results[m] for m in modes)
        seen.update(a.num_accepted)
        assert a.sampled_token_ids == b.sampled_token_ids, r
        assert a.num_accepted == b.num_accepted and a.num_rolled_back == b.num_rolled_back, r
        assert a.draft_token_ids == b.draft_token_ids, r
        one, two = (lanes[m] for m in modes)
        slots = list(range(len(PROMPTS)))
        for x, y in zip(one.runner.cache.state_stacks, two.runner.cache.state_stacks, strict=True):
            torch.testing.assert_close(x[:, slots], y[:, slots], rtol=1e-4, atol=1e-5)
        for x, y in zip(context_kv(one.runner, one), context_kv(two.runner, two), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-5)
    for mode, lane in lanes.items():  # each runner took the round it names
        spec = lane.runner.spec
        assert spec is not None
        assert spec.num_one_wait_rounds == (rounds if mode in ("one_wait", "graph") else 0), mode
        # the general round's blocks take the drafter's buffers too (its rows are verify rows of one width)
        assert (spec.draft_graphs is not None and spec.draft_graphs.runs == rounds) or (
            mode == "eager" and spec.draft_graphs is None
        ), mode
        if mode == "graph":  # every round replayed the verify's and the drafter's graphs
            assert spec.graphs is not None and spec.graphs.captured and spec.draft_graphs is not None
            assert spec.draft_graphs.captured and spec.draft_graphs.num_replays == rounds
            assert spec.graphs.num_replays >= rounds
    return seen


@pytest.mark.parametrize("k", [2, 15])
@pytest.mark.parametrize("mode", ["one_wait", "general"])
def test_static_rounds_equal_the_eager_round_by_round(k: int, mode: str) -> None:
    seen = compare_rounds(k, (mode, "eager"))
    assert 0 in seen and max(seen) > 0, seen
    if k == 2:
        assert k in seen, seen  # drafts accepted in full


@pytest.mark.parametrize("one_wait_sampled", [True, False])
def test_sampled_rounds_on_the_static_buffers_equal_the_eager_rounds(one_wait_sampled: bool) -> None:
    """Seeded sampled rows take the sampled one-wait round (engine/runner/dflash_round.py `run_dflash_sampled`), or
    with it off the general round with its blocks on the drafter's buffers; either way their proposals are drawn from
    the processed q as the eager drafter draws them, and each request's generator is drawn in the eager round's
    order (per row: the acceptance uniforms, the residual's race, then the drafts' races): a seeded run gives the
    eager run's tokens."""
    params = SamplingParams(temperature=0.8, top_p=0.9, seed=5, max_tokens=12)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    static, eager = core(3, max_concurrency=3), core(3, max_concurrency=3)
    assert eager.runner.spec is not None and static.runner.spec is not None
    eager.runner.spec.graphs = eager.runner.spec.draft_graphs = None
    static.runner.spec.one_wait_sampled = one_wait_sampled
    assert run(static, prompts, params)[0] == run(eager, prompts, params)[0]
    spec = static.runner.spec
    assert spec.draft_graphs is not None and spec.draft_graphs.runs > 0
    assert spec.num_one_wait_rounds == spec.num_sampled_one_wait_rounds
    assert (spec.num_sampled_one_wait_rounds > 0) == one_wait_sampled


def test_the_one_wait_round_runs_on_the_static_buffers() -> None:
    runner = dflash_runner(3, "one_wait", 3)
    lanes = Lanes(runner, num_pages=3)
    for _ in range(3):
        lanes.round(lanes.drafts)
    spec = runner.spec
    assert spec is not None and spec.draft_graphs is not None and spec.graphs is not None
    assert spec.num_one_wait_rounds == 3 and spec.draft_graphs.runs == 3
    assert all(len(d) == 3 for d in lanes.drafts)


def _graphs(sizes: tuple[int, ...], max_pages: int = 3) -> tuple[DFlashGraphs, DFlashDrafter]:
    runner = dflash_runner(3, "eager", 3)
    spec = runner.spec
    assert spec is not None and isinstance(spec.drafter, DFlashDrafter)
    return DFlashGraphs(spec.drafter, num_draft_tokens=3, max_pages=max_pages, sizes=sizes), spec.drafter


def test_a_fill_stores_fed_positions_and_sends_padding_to_the_sink() -> None:
    graphs, drafter = _graphs((4,))
    sink = drafter.kv.sink
    graphs.fill([DraftRow(62, (2, 0)), DraftRow(5, (1,))], 3, 3)  # width 3 of W = 4
    assert graphs.store_pos[:12].tolist() == [62, 63, 64, 0, 5, 6, 7, 0, *[0] * 4]
    # position 64 sits in the row's second page (page 0); a row's 4th position and the padding row: the sink
    assert graphs.store_slots[:12].tolist() == [190, 191, 0, sink, 69, 70, 71, sink, *[sink] * 4]
    assert graphs.ends[:3].tolist() == [0, 0, 0] and graphs.page_table[:2, :2].tolist() == [[2, 0], [1, 0]]


def test_padding_rows_and_positions_write_nothing_and_change_no_draft() -> None:
    """Two rows padded to four (width 2 of W = 4): the context KV changes at the rows' fed slots and the sink only,
    and the blocks' outputs equal those of the same round unpadded."""
    padded, drafter = _graphs((4,))
    exact, _ = _graphs((2,))
    features = torch.randn(4, padded.features.shape[1], generator=torch.Generator().manual_seed(0))
    rows = [DraftRow(40, (0,)), DraftRow(70, (2, 1))]
    ends, anchors = torch.tensor([41, 72]), torch.tensor([11, 12])
    kv = drafter.kv
    before = [t.clone() for t in (*kv.keys, *kv.values)]
    with torch.inference_mode():
        got = padded.draft(rows, features, ends, anchors, 2)
        written = {40, 41, 70, 71, kv.sink}  # row 1's positions 70, 71 sit in its second page (page 1)
        for old, new in zip(before, (*kv.keys, *kv.values), strict=True):
            changed = set((old != new).any(dim=(1, 2)).nonzero().flatten().tolist())
            assert changed <= written and changed - {kv.sink}, changed
        want = exact.draft(rows, features, ends, anchors, 2)
    assert got.shape == want.shape == (2, 3, drafter.config.hidden_size)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


def test_buckets_and_keys_stay_bounded() -> None:
    assert context_buckets(100) == (100,)
    assert context_buckets(1000) == (MIN_BUCKET, 2 * MIN_BUCKET, 1000)
    assert context_buckets(4096) == (256, 512, 1024, 2048, 4096)
    graphs, _ = _graphs((1, 2, 4, 8), max_pages=40)  # 2560 tokens a row
    assert graphs.buckets == (256, 512, 1024, 2048, 2560)
    assert graphs.key([DraftRow(252, (0,) * 5)], 4) == (1, 256)  # e <= start + width = 256
    assert graphs.key([DraftRow(253, (0,) * 5)], 4) == (1, 512)
    assert graphs.key([DraftRow(100, (0,))] * 3, 4) == (4, 256)
    assert graphs.key([DraftRow(100, (0,))] * 9, 4) is None and graphs.key([DraftRow(0, (0,))], 5) is None
    small = DFlashGraphs(
        graphs.drafter, num_draft_tokens=3, max_pages=40, sizes=(1, 2), max_graph_context=1024
    )
    assert small.graph_buckets == (256, 512, 1024)
    keys = small.keys()
    assert len(keys) == len(set(keys)) == 2 * 3 and keys[0] == (2, 1024)
    assert not small.capture() and not small.captured  # no graphs on the CPU: the eager static path


def test_the_graph_context_switch_is_parsed(monkeypatch: pytest.MonkeyPatch) -> None:
    from engine import env

    monkeypatch.delenv("NINFER_DFLASH_GRAPH_CONTEXT", raising=False)
    assert env.dflash_graph_context() == env.DFLASH_GRAPH_CONTEXT
    monkeypatch.setenv("NINFER_DFLASH_GRAPH_CONTEXT", "0")
    assert env.dflash_graph_context() == 0
    graphs, _ = _graphs((1,))
    assert graphs.graph_buckets == () and graphs.keys() == []
    monkeypatch.setenv("NINFER_DFLASH_GRAPH_CONTEXT", "-3")
    with pytest.raises(ValueError, match="NINFER_DFLASH_GRAPH_CONTEXT='-3': expected a token count >= 0"):
        env.dflash_graph_context()


def test_a_captured_key_replays_over_the_filled_buffers_and_returns_its_rows_drafts() -> None:
    """The replay decision without a GPU: a key with a graph replays it after the fill and the device inputs
    (features, frontiers, anchors) are written, and returns its static output's rows; a key without one runs the
    function eagerly."""
    graphs, _ = _graphs((2, 4))
    seen: list[tuple[list[int], list[int], list[int]]] = []

    class FakeGraph:
        def replay(self) -> None:
            seen.append(
                (graphs.ends[:4].tolist(), graphs.anchors[:4].tolist(), graphs.store_pos[:8].tolist())
            )

    static = torch.arange(12).view(4, 3)
    graphs._graphs[(4, 192)] = FakeGraph()  # type: ignore[assignment]
    graphs._outputs[(4, 192)] = static
    rows = [DraftRow(40, (0,)), DraftRow(70, (2, 1)), DraftRow(9, (1,))]
    features = torch.zeros(6, graphs.features.shape[1])
    with torch.inference_mode():
        out = graphs.draft(rows, features, torch.tensor([41, 71, 10]), torch.tensor([5, 6, 7]), 2)
        assert seen == [([41, 71, 10, 0], [5, 6, 7, 0], [40, 41, 0, 0, 70, 71, 0, 0])]
        assert out.tolist() == static[:3].tolist() and graphs.num_replays == 1
        eager = graphs.draft(rows[:2], features[:4], torch.tensor([41, 71]), torch.tensor([5, 6]), 2)
    assert eager.shape == (2, 3, 64) and graphs.num_replays == 1 and graphs.runs == 2
