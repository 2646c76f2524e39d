"""`--spec dflash` on the GPU (Triton kernels, CUDA SDPA in the companion) with the tiny MoE + tiny companion:
greedy output equals the plain output for K 1, 4, 15 with one and eight lanes, on the general rounds (the model's
default presence penalty) and on the one-wait rounds replaying CUDA graphs (no penalty); the captured rounds
(engine/spec/dflash_graphs.py and the target graphs) equal the same rounds run eagerly, round by round; the
companion's own proposals in bf16 are finite tokens; the bench mode's DFlash round runs on its graphs. float32 target weights for the comparison (see
test_spec_gpu.py). Run on the device machine (`-m gpu`).
"""

from __future__ import annotations

import functools
from typing import Any

import pytest
import torch
from engine_harness import prompt, run
from test_spec_dflash_engine import dflash_artifact

from engine.config import EngineConfig
from engine.core import EngineCore, LoadedArtifact, load_artifact
from engine.request import SamplingParams

pytestmark = pytest.mark.gpu

GREEDY = SamplingParams(temperature=0.0, max_tokens=17)
LENGTHS = [5, 17, 40, 66, 9, 100, 3, 30]


@functools.cache
def loaded(dtype: torch.dtype = torch.float32) -> LoadedArtifact:
    return load_artifact(dflash_artifact(), device="cuda", dtype=dtype, with_dflash=True)


def core(dtype: torch.dtype = torch.float32, **flags: Any) -> EngineCore:
    flags.setdefault("max_context", 512)
    flags.setdefault("pending_timeout_ms", 600_000)  # the first steps compile the Triton kernels
    flags.setdefault("prefill_chunk_multiple", 1)
    art = loaded(dtype)
    return EngineCore(art.model, art.tokenizer, EngineConfig.from_flags(**flags), seed=0)


def test_greedy_dflash_equals_plain_on_the_gpu():
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(max_concurrency=8, prefix_reuse=False), prompts, GREEDY)[0]
    for k in (1, 4, 15):
        assert run(core(max_concurrency=8, spec="dflash", draft_tokens=k), prompts, GREEDY)[0] == want, k
        assert run(core(spec="dflash", draft_tokens=k), prompts[:1], GREEDY)[0] == want[:1], k


def test_greedy_dflash_on_graph_rounds_equals_plain_on_the_gpu():
    params = SamplingParams(temperature=0.0, presence_penalty=0.0, max_tokens=17)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(max_concurrency=8, prefix_reuse=False), prompts, params)[0]
    for k in (2, 15):
        engine = core(max_concurrency=8, spec="dflash", draft_tokens=k)
        assert run(engine, prompts, params)[0] == want, k
        spec = engine.runner.spec
        assert spec is not None and spec.num_one_wait_rounds > 0 and spec.draft_graphs is not None
        assert spec.draft_graphs.num_replays >= spec.num_one_wait_rounds, k  # general rounds replay too
        assert run(core(spec="dflash", draft_tokens=k), prompts[:1], params)[0] == want[:1], k


@pytest.mark.parametrize(("k", "modes"), [(2, ("graph", "one_wait")), (15, ("graph", "one_wait")),
                                          (7, ("graph", "eager"))])  # fmt: skip
def test_captured_dflash_rounds_equal_eager_rounds(k, modes):
    """Graph replays against the same static functions run eagerly (and, K=7, against the eager round): the same
    tokens, counts, drafts, GDN state and context KV after every round (test_spec_dflash_graphs.compare_rounds)."""
    from test_spec_dflash_graphs import compare_rounds

    seen = compare_rounds(k, modes, device="cuda")
    assert 0 in seen and max(seen) > 0, seen


def test_bf16_dflash_runs_and_counts_rounds():
    engine = core(torch.bfloat16, max_concurrency=4, spec="dflash", draft_tokens=7)
    got = run(engine, [prompt(n, s) for s, n in enumerate(LENGTHS[:4])], GREEDY)[0]
    assert all(len(t) == GREEDY.max_tokens for t in got)
    stats = engine.scheduler.spec_stats
    assert stats.method == "dflash" and stats.rounds > 0 and stats.drafted >= stats.rounds


def test_bench_dflash_round_runs():
    from engine.testing.bench.spec import make_spec_runner, run_spec_rounds

    model = loaded(torch.bfloat16).model
    runner = make_spec_runner(model, 64, 2, "bf16", 7, 1024, spec="dflash")
    got = run_spec_rounds(runner, model.config.vocab_size, 2, 200, 2, 4, 7)
    assert got["round_s"] > 0 and got["tokens_per_round"] >= 1.0
    assert (
        runner.spec_graphs_captured and got["graph_replays_per_round"] >= 2
    )  # the verify's and the drafter's


def test_greedy_penalized_rows_through_the_sampled_dflash_round_equal_plain_on_the_gpu():
    """The sampled one-wait DFlash round (engine/runner/dflash_round.py `run_dflash_sampled`) on the captured graphs
    for greedy rows with presence and frequency penalties: the plain tokens, eight lanes, K 2 and 15."""
    params = SamplingParams(temperature=0.0, presence_penalty=-2.0, frequency_penalty=0.5, max_tokens=17)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(max_concurrency=8, prefix_reuse=False), prompts, params)[0]
    for k in (2, 15):
        engine = core(max_concurrency=8, spec="dflash", draft_tokens=k)
        spec = engine.runner.spec
        assert spec is not None and engine.runner.spec_graphs_captured and spec.draft_graphs is not None
        assert run(engine, prompts, params)[0] == want, k
        assert spec.num_sampled_one_wait_rounds > 0 and spec.draft_graphs.num_replays > 0


def test_the_server_preset_takes_the_sampled_dflash_round_on_graphs_and_a_seed_reproduces():
    from dataclasses import replace

    from engine.sampling import default_sampling

    params = replace(default_sampling(moe=True, thinking=False), seed=11, max_tokens=24)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    outs = []
    for _ in range(2):
        engine = core(max_concurrency=8, spec="dflash", draft_tokens=7)
        spec = engine.runner.spec
        assert spec is not None and spec.draft_graphs is not None and spec.graphs is not None
        outs.append(run(engine, prompts, params)[0])
        assert spec.num_sampled_one_wait_rounds > 0
        assert spec.draft_graphs.num_replays > 0 and spec.graphs.num_replays > 0
    assert outs[0] == outs[1] and all(len(t) == 24 for t in outs[0])


def test_bench_sampled_dflash_round_runs():
    """`ninfer-bench --spec dflash --spec-sampled`'s round: every step after the width-1 first one takes the sampled
    one-wait round and replays the verify's and the drafter's graphs."""
    from engine.sampling import default_sampling
    from engine.testing.bench.spec import make_spec_runner, run_spec_rounds

    model = loaded(torch.bfloat16).model
    runner = make_spec_runner(model, 64, 2, "bf16", 7, 1024, spec="dflash")
    params = default_sampling(moe=True, thinking=False)
    got = run_spec_rounds(runner, model.config.vocab_size, 2, 200, 2, 4, 7, params)
    assert got["round_s"] > 0 and got["tokens_per_round"] >= 1.0
    assert runner.spec_graphs_captured and got["graph_replays_per_round"] >= 2
    assert runner.spec is not None and runner.spec.num_sampled_one_wait_rounds == 5
