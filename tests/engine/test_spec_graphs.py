"""The speculative step's static buffers (engine/spec/graphs.py) on the CPU: the layout a captured graph reads
(rows, padding rows, the catch-up's sink sequence), and the engine through them (the same path CUDA graphs
replay, run eagerly here) gives the eager path's and the plain engine's greedy tokens.
The replay itself is checked on the GPU (tests/engine/test_spec_gpu.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
import torch
from engine_harness import make_core, one_thread, prompt, run
from test_spec_engine import spec_core

from engine.request import SamplingParams
from engine.spec.graphs import SpecInputs, StaticRow


@pytest.fixture(autouse=True)
def _one_thread():
    with one_thread():
        yield


def _inputs(k: int = 2) -> SpecInputs:
    return SpecInputs.allocate(4, k, 6, 4, 8, torch.float32, torch.device("cpu"))


def test_a_verify_fill_writes_rows_and_pads_with_rows_that_store_nothing():
    inputs, pages = _inputs(), [None] * 5
    rows = [
        StaticRow((5, 6, 7), 5, (3, 1), 0, True, (10, 11)),
        StaticRow((8, 9, 4), 0, (2,), 1, False, (12, 13)),
    ]
    inputs.fill(rows, 3, 3, pages)
    batch = inputs.batch(3, 3)
    assert batch.input_ids.tolist() == [5, 6, 7, 8, 9, 4, 0, 0, 0]
    assert batch.positions.tolist() == [5, 6, 7, 0, 1, 2, 0, 1, 2]
    # positions 5..7 sit in the row's second page (page 1: slots 4..7); padding rows store nothing (-1)
    assert batch.slot_mapping.tolist() == [5, 6, 7, 8, 9, 10, -1, -1, -1]
    assert batch.query_start_loc.tolist() == [0, 3, 6, 9] and batch.seq_lens.tolist() == [8, 3, 3]
    assert batch.state_slots.tolist() == [0, 1, -1] and batch.has_initial_state.tolist() == [
        True,
        False,
        False,
    ]
    assert batch.verify_width == 3 and batch.snapshot_slots is not None
    # a padding row's snapshot slots are -1, like its state slot: its verify positions touch no state
    assert batch.snapshot_slots.tolist() == [[10, 11], [12, 13], [-1, -1]]
    assert batch.page_table[:2, :2].tolist() == [[3, 1], [2, 0]] and pages[:2] == [(3, 1), (2,)]


def test_a_catch_up_fill_packs_rows_and_gives_the_rest_to_a_sink_sequence():
    inputs = _inputs()  # R = 4 token rows per row
    rows = [StaticRow((5, 6), 3, (0, 1)), StaticRow((7, 8, 9, 1), 8, (2, 3, 4))]
    inputs.fill(rows, 3, 0, [None] * 5)
    batch = inputs.batch(3, 0)
    assert batch.num_tokens == 16 and batch.num_sequences == 4  # 3 rows + the sink
    assert batch.query_start_loc.tolist() == [0, 2, 6, 7, 16]  # the padding row feeds one token
    assert batch.seq_lens.tolist() == [5, 12, 1, 9]
    assert batch.slot_mapping[:6].tolist() == [3, 4, 16, 17, 18, 19]
    assert set(batch.slot_mapping[6:].tolist()) == {-1}  # padding and sink rows store nothing
    assert batch.positions[6:].tolist() == [0, *range(9)] and batch.verify_width == 0


def test_fits_only_rows_a_captured_shape_holds():
    from engine_harness import tiny_loaded

    from engine.cache.kv import allocate_cache
    from engine.model.forward import kv_spec
    from engine.spec.graphs import SpecGraphs

    model = tiny_loaded("dense").model
    cache = allocate_cache(kv_spec(model.config, torch.float32, with_mtp=False), 8, 4, 2, "cpu")
    graphs = SpecGraphs(model, cache, num_draft_tokens=2, max_pages=6)
    row = StaticRow((1, 2, 3), 0, (0,))
    assert graphs.fits([row] * 8, 3) and not graphs.fits([row] * 9, 3)  # sizes 1..8
    assert not graphs.fits([StaticRow((1,) * 4, 0, (0,))], 4)  # width > K + 1
    assert not graphs.fits([StaticRow((1,), 0, tuple(range(7)))], 1)  # more pages than the table row
    assert graphs.fits([StaticRow((1,) * 4, 0, (0,))], 0) and not graphs.fits(
        [StaticRow((1,) * 5, 0, (0,))], 0
    )
    assert not graphs.captured and not graphs.capture()  # no graphs on the CPU: the eager static path


def test_the_static_path_gives_the_eager_and_the_plain_tokens():
    params = SamplingParams(temperature=0.0, max_tokens=8)
    prompts = [prompt(n, s) for s, n in enumerate((5, 17, 30))]
    want = run(make_core("dense", prefix_reuse=False, max_concurrency=3), prompts, params)[0]
    static = spec_core("dense", 2, max_concurrency=3)
    spec = static.runner.spec
    assert spec is not None and spec.graphs is not None
    assert run(static, prompts, params)[0] == want
    assert all(n > 0 for n in spec.graphs.runs.values()), spec.graphs.runs  # verify, catch-up, draft
    eager = spec_core("dense", 2, max_concurrency=3)
    assert eager.runner.spec is not None
    eager.runner.spec.graphs = eager.runner.spec.drafter.graphs = None
    assert run(eager, prompts, params)[0] == want


def test_a_captured_key_replays_over_the_filled_buffers_and_returns_its_static_outputs():
    """The replay decision without a GPU: a key with a graph replays it (after the fill) and returns the rows'
    slice of its static outputs; a key without one runs the forward eagerly; capture covers every key."""
    from engine_harness import tiny_loaded

    from engine.cache.kv import allocate_cache
    from engine.model.forward import kv_spec
    from engine.spec.graphs import SpecGraphs

    model = tiny_loaded("dense").model
    cache = allocate_cache(kv_spec(model.config, torch.float32, with_mtp=False), 8, 4, 3, "cpu")
    graphs = SpecGraphs(model, cache, num_draft_tokens=2, max_pages=6)
    seen: list[list[int]] = []

    class FakeGraph:
        def replay(self) -> None:
            seen.append(graphs.inputs.input_ids[:6].tolist())

    static = torch.arange(6 * model.config.hidden_size, dtype=torch.float32).view(6, -1)
    graphs._graphs[("target", 2, 3)] = FakeGraph()  # type: ignore[assignment]
    graphs._outputs[("target", 2, 3)] = (static,)
    rows = [StaticRow((5, 6, 7), 0, (0,), 0, False, (1, 1)), StaticRow((8, 9, 4), 0, (1,), 1, False, (1, 1))]
    out = graphs.target(rows, 3)
    assert seen == [[5, 6, 7, 8, 9, 4]] and out.data_ptr() == static.data_ptr() and graphs.num_replays == 1
    eager = graphs.target(rows[:1], 3)  # size 1 has no graph: the real forward
    assert eager.shape == (3, model.config.hidden_size) and graphs.num_replays == 1
    assert graphs.runs["target"] == 2
    keys = graphs.keys()  # widths 1..K+1 per size, one catch-up and one draft per size, largest first
    assert len(keys) == len(set(keys)) == 8 * 3 + 8 + 8
    sizes = [graphs.inputs.num_tokens(size, width) for _, size, width in keys]
    assert sizes == sorted(sizes, reverse=True)


def recorded_proposals(
    make: Callable[[], Any],
    prompts: list[list[int]],
    params: SamplingParams,
    on_device: bool,
    eager: bool,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[tuple[tuple[int, ...], ...]], int]:
    """Every MTP proposal of a run of `make()`'s speculative engine, and how often the device chain ran
    (`on_device=False` forces the host chain; `eager` drops the static buffers). Shared with test_spec_gpu.py."""
    import engine.spec.mtp as mtp

    calls, seen = [0], []
    advance, on_device_fn = mtp.MtpDrafter.advance, mtp.MtpDrafter._propose_on_device

    def record(self, rows, hidden):
        out = advance(self, rows, hidden)
        seen.append(tuple(p.tokens for p in out))
        return out

    def count(self, *args):
        calls[0] += 1
        return on_device_fn(self, *args)

    with monkeypatch.context() as m:
        m.setattr(mtp.MtpDrafter, "advance", record)
        m.setattr(mtp.MtpDrafter, "_propose_on_device", count)
        if not on_device:
            m.setattr(mtp, "device_draftable", lambda p: False)
        core = make()
        assert core.runner.spec is not None
        core.runner.spec.one_wait = (
            False  # the general round's chain (the one-wait round's: test_spec_one_wait.py)
        )
        if eager:
            core.runner.spec.graphs = core.runner.spec.drafter.graphs = None
        run(core, prompts, params)
    return seen, calls[0]


@pytest.mark.parametrize("path", ["static", "eager"])
@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_greedy_drafts_chained_on_the_device_equal_the_host_chain(arch, path, monkeypatch):
    """Greedy rows without penalties keep each draft's argmax on the device and feed it to the next chained MTP
    step (one copy of the drafts per round): the proposals equal those of the host chain, draft by draft."""
    params = SamplingParams(temperature=0.0, max_tokens=10, presence_penalty=0.0)
    prompts = [prompt(n, s) for s, n in enumerate((5, 17, 30))]
    make = lambda: spec_core(arch, 3, max_concurrency=3)  # noqa: E731
    host, host_calls = recorded_proposals(make, prompts, params, False, path == "eager", monkeypatch)
    device, device_calls = recorded_proposals(make, prompts, params, True, path == "eager", monkeypatch)
    assert host_calls == 0 and device_calls > 0
    assert any(len(p) > 1 for step in device for p in step), "no chained draft was proposed"
    assert device == host


def test_a_device_patch_moves_draft_rows_and_sets_tokens_over_a_fill():
    """`DevicePatch` after a fill: token ids at flat indices; a one-token row moved to a device position takes the
    slot of that position in its filled page-table row and seq_len = position + 1; a position at or past the row's
    capacity stores nothing (slot -1) and reads up to its last page position. Padding rows stay as filled."""
    from engine.spec.graphs import DevicePatch

    inputs = _inputs()  # 4 rows, K=2, 6 pages per row, page size 4
    pages: list = [None] * 5
    rows = [StaticRow((9,), 1, (3, 5)), StaticRow((9,), 2, (2,))]
    inputs.fill(rows, 3, 1, pages)
    DevicePatch(
        token_index=torch.tensor([1]),
        token_values=torch.tensor([77]),
        positions=torch.tensor([6, 4]),
        capacity=torch.tensor([8, 4]),
    ).apply(inputs)
    assert inputs.input_ids[:3].tolist() == [9, 77, 0]
    assert inputs.positions[:3].tolist() == [6, 3, 0]  # row 1: past its 4 slots, reads position 3
    assert inputs.slot_mapping[:3].tolist() == [5 * 4 + 2, -1, -1]
    assert inputs.seq_lens[:3].tolist() == [7, 4, 1]
