"""`--spec mtp` on the GPU (Triton kernels) with the tiny artifacts: invariant 3 (greedy output with
speculation = without it), K 1..5, one and eight lanes; the speculative CUDA graphs (verify widths, MTP
catch-up, draft steps: engine/spec/graphs.py) replay to the eager output; drafts that always agree give K + 1 tokens per
round; the bench mode's round runs at a tiny geometry.

float32 weights: the verify pass multiplies [k + 1, H] rows where a plain step multiplies [1, H], so in bf16
a near-tie argmax on a random model could flip between the two shapes (a rounding difference, not a
rollback error); float32 keeps the comparison about the algorithm. Run on the device machine (`-m gpu`).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from engine_harness import agreeing_drafts, prompt, run, tiny_artifact

from engine.config import EngineConfig
from engine.core import EngineCore, LoadedArtifact, load_artifact
from engine.request import SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=16)
LENGTHS = [5, 17, 40, 66, 9, 100, 3, 30]


@functools.cache
def loaded(arch: str) -> LoadedArtifact:
    return load_artifact(tiny_artifact(arch), device="cuda", dtype=torch.float32, with_mtp=True)


def core(arch: str, **flags: Any) -> EngineCore:
    flags.setdefault("max_context", 512)
    flags.setdefault("pending_timeout_ms", 600_000)  # the first steps compile the Triton kernels
    flags.setdefault("prefill_chunk_multiple", 1)
    art = loaded(arch)
    return EngineCore(art.model, art.tokenizer, EngineConfig.from_flags(**flags), seed=0)


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_greedy_spec_equals_plain_on_the_gpu(arch):
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(arch, max_concurrency=8, prefix_reuse=False), prompts, GREEDY)[0]
    for k in (1, 2, 3, 4, 5):
        assert run(core(arch, max_concurrency=8, spec="mtp", draft_tokens=k), prompts, GREEDY)[0] == want, k
        assert run(core(arch, spec="mtp", draft_tokens=k), prompts[:1], GREEDY)[0] == want[:1], k


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_spec_graph_replay_equals_eager_and_plain(arch):
    """K 1, 2 and 5 at C=1 and C=8: the graph-replayed speculative engine gives the eager speculative engine's tokens
    (and the plain engine's); every kind of speculative forward that K uses replayed a graph."""
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(arch, max_concurrency=8, prefix_reuse=False, cuda_graph=False), prompts, GREEDY)[0]
    for k in (1, 2, 5):  # every K replays graphs in test_greedy_spec_equals_plain_on_the_gpu; here K=1 (no
        for c in (1, 8):  # chained draft), K=2 (one) and the widest K against the eager engine
            graphed = core(arch, max_concurrency=c, spec="mtp", draft_tokens=k)
            assert graphed.runner.spec_graphs_captured, "speculative graphs were not captured"
            eager = core(arch, max_concurrency=c, spec="mtp", draft_tokens=k, cuda_graph=False)
            assert not eager.runner.spec_graphs_captured
            subset = prompts[:c]
            got = run(graphed, subset, GREEDY)[0]
            assert got == run(eager, subset, GREEDY)[0] == want[:c], (k, c)
            spec = graphed.runner.spec
            assert spec is not None and spec.graphs is not None
            # a chained draft step follows the first draft only when K >= 2
            chained = {"target", "catch_up", "draft"} if k >= 2 else {"target", "catch_up"}
            runs = spec.graphs.runs
            assert spec.graphs.num_replays > 0 and all(runs[n] > 0 for n in chained), (k, c, runs)
            assert k >= 2 or runs["draft"] == 0, runs


@pytest.mark.parametrize("copy", ["gather", "skip"])
def test_always_agreeing_drafts_on_the_gpu(copy, monkeypatch):
    """Every round keeps every draft; under `NINFER_ROLLBACK_COPY=skip` (kernels/state_copy.py) no rollback copy then
    moves a byte, and the tokens stay the plain ones."""
    from kernels import _dispatch

    monkeypatch.setattr(_dispatch, "ROLLBACK_COPY", copy)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS[:4])]
    want = run(core("dense", max_concurrency=4, prefix_reuse=False), prompts, GREEDY)[0]
    engine = core("dense", max_concurrency=4, spec="mtp", draft_tokens=3)
    spec = engine.runner.spec
    assert spec is not None
    agreeing_drafts(
        spec, {f"r{i}": w for i, w in enumerate(want)}
    )  # every round's drafts, the one-wait rounds' too
    assert run(engine, prompts, GREEDY)[0] == want
    stats = engine.scheduler.spec_stats
    assert stats.accepted == stats.drafted > 0
    assert spec.num_one_wait_rounds > 0  # the one-wait greedy round (engine/runner/spec_round.py) took them


def test_bench_spec_round_runs():
    from engine.testing.bench.spec import make_spec_runner, run_spec_rounds

    model = loaded("dense").model
    runner = make_spec_runner(model, 64, 2, "bf16", 3, 1024)
    assert runner.spec_graphs_captured
    got = run_spec_rounds(runner, model.config.vocab_size, 2, 200, 2, 4, 3)
    assert got["round_s"] > 0 and got["tokens_per_round"] >= 1.0
    assert got["graph_replays_per_round"] >= 2  # the verify pass and the catch-up, at least


def test_lm_head_draft_graphs_on_the_gpu(tmp_path):
    """`--lm-head-draft` through the captured draft step: greedy output = plain, drafts from the shortlist."""
    from test_spec_draft_head import _converted

    from engine.core import load_artifact
    from engine.spec.draft_head import draft_head_of

    art = load_artifact(
        _converted(tmp_path), device="cuda", dtype=torch.float32, with_mtp=True, lm_head_draft=True
    )
    head = draft_head_of(art.model)
    assert head is not None
    shortlist = set(head.token_ids.tolist())
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    flags: dict[str, Any] = {"max_context": 512, "pending_timeout_ms": 600_000, "prefill_chunk_multiple": 1}
    plain = EngineCore(art.model, art.tokenizer, EngineConfig.from_flags(max_concurrency=8, **flags), seed=0)
    want = run(plain, prompts, GREEDY)[0]
    config = EngineConfig.from_flags(
        max_concurrency=8, spec="mtp", draft_tokens=3, lm_head_draft=True, **flags
    )
    engine = EngineCore(art.model, art.tokenizer, config, seed=0)
    spec = engine.runner.spec
    assert spec is not None and engine.runner.spec_graphs_captured
    real, drafts = spec.run, []

    def run_step(rows, history, plain_sample):  # every round's drafts (the one-wait round's too)
        out = real(rows, history, plain_sample)
        drafts.extend(t for d in out.drafts for t in d)
        return out

    spec.run = run_step  # type: ignore[method-assign]
    assert run(engine, prompts, GREEDY)[0] == want
    assert drafts and set(drafts) <= shortlist
    assert spec.graphs is not None and spec.graphs.runs["draft"] > 0 and spec.graphs.num_replays > 0


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_greedy_drafts_chained_on_the_device_equal_the_host_chain_with_graphs(arch, monkeypatch):
    """On CUDA graphs: the device-fed chained drafts (engine/spec/mtp.py `_propose_on_device`) equal the host
    chain's, draft by draft, at K=4 and C=3."""
    from test_spec_graphs import recorded_proposals

    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS[:3])]
    params = SamplingParams(temperature=0.0, max_tokens=12, ignore_eos=True, presence_penalty=0.0)
    make = lambda: core(arch, max_concurrency=3, spec="mtp", draft_tokens=4)  # noqa: E731
    host, host_calls = recorded_proposals(make, prompts, params, False, False, monkeypatch)
    device, device_calls = recorded_proposals(make, prompts, params, True, False, monkeypatch)
    assert host_calls == 0 and device_calls > 0 and device == host


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_the_one_wait_round_with_graphs_gives_the_plain_tokens(arch, k):
    """The one-wait greedy round (engine/runner/spec_round.py: acceptance, rollback, fixed-shape catch-up and
    device-positioned draft steps queued before one host copy) through the captured graphs, on and off: the plain
    greedy tokens, eight lanes."""
    params = SamplingParams(temperature=0.0, max_tokens=16, presence_penalty=0.0)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(arch, max_concurrency=8, prefix_reuse=False), prompts, params)[0]
    for one_wait in (True, False):
        engine = core(arch, max_concurrency=8, spec="mtp", draft_tokens=k)
        spec = engine.runner.spec
        assert spec is not None and engine.runner.spec_graphs_captured and spec.graphs is not None
        spec.one_wait = one_wait
        assert run(engine, prompts, params)[0] == want, one_wait
        assert (spec.num_one_wait_rounds > 0) == one_wait and spec.graphs.num_replays > 0


def test_the_skipping_rollback_copy_equals_the_gather_on_the_gpu():
    """The one-wait rollback (engine/runner/spec_round.py `roll_back`) of rows that kept every draft, some and none,
    with `NINFER_ROLLBACK_COPY=skip` (the Triton copy) and `gather`: the same bits in every slot; each working slot
    the state of decoding its kept positions one step at a time; the all-kept rows' slots as the verify left them."""
    from test_spec_engine import verify_and_roll_back

    accepted = [3, 1, 0, 3, 2]
    model = loaded("dense").model
    gathered = verify_and_roll_back(model, accepted, skip=False)
    verified, rolled, want = verify_and_roll_back(model, accepted, skip=True)
    for a, b in zip(gathered[1], rolled, strict=True):
        assert torch.equal(a, b)
    for i, kept in enumerate(accepted):
        for kind in range(2):
            torch.testing.assert_close(rolled[kind][0, i], want[i][kind], rtol=1e-5, atol=1e-6)
            if kept == 3:
                assert torch.equal(rolled[kind][:, i], verified[kind][:, i])


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_spec_with_the_skipping_rollback_copy_equals_plain(arch, monkeypatch):
    """`NINFER_ROLLBACK_COPY=skip` through the engine (graphs, one-wait rounds, drafts kept in full, in part and not
    at all): the plain greedy tokens, eight lanes, K 3."""
    from kernels import _dispatch

    monkeypatch.setattr(_dispatch, "ROLLBACK_COPY", "skip")
    params = SamplingParams(temperature=0.0, max_tokens=16, presence_penalty=0.0)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(arch, max_concurrency=8, prefix_reuse=False), prompts, params)[0]
    engine = core(arch, max_concurrency=8, spec="mtp", draft_tokens=3)
    assert run(engine, prompts, params)[0] == want
    spec = engine.runner.spec
    assert spec is not None and spec.num_one_wait_rounds > 0
