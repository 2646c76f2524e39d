"""The sampled one-wait round (engine/runner/spec_sampled.py) on the GPU through the captured speculative graphs:
greedy penalized rows give the plain engine's tokens, with the round on and off; the server's preset with a seed
replays the verify, catch-up and draft graphs and reproduces; the bench's sampled round runs and reads once a round.
Run on the device machine (`-m gpu`)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from engine_harness import prompt, run
from test_spec_gpu import LENGTHS, core, loaded

from engine.request import SamplingParams
from engine.sampling import default_sampling

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("k", [1, 3])
def test_the_sampled_round_with_graphs_gives_the_plain_tokens_for_greedy_penalized_rows(arch, k):
    params = SamplingParams(temperature=0.0, max_tokens=16, presence_penalty=-2.0, frequency_penalty=0.5)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(arch, max_concurrency=8, prefix_reuse=False), prompts, params)[0]
    for sampled in (True, False):
        engine = core(arch, max_concurrency=8, spec="mtp", draft_tokens=k)
        spec = engine.runner.spec
        assert spec is not None and engine.runner.spec_graphs_captured and spec.graphs is not None
        spec.one_wait_sampled = sampled
        assert run(engine, prompts, params)[0] == want, sampled
        assert (spec.num_sampled_one_wait_rounds > 0) == sampled and spec.graphs.num_replays > 0


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_the_server_preset_replays_the_graphs_and_a_seed_reproduces(arch):
    params = replace(default_sampling(moe=arch == "moe", thinking=False), seed=11, max_tokens=24)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    outs = []
    for _ in range(2):
        engine = core(arch, max_concurrency=8, spec="mtp", draft_tokens=3)
        spec = engine.runner.spec
        assert spec is not None and spec.graphs is not None
        replays = spec.graphs.num_replays
        outs.append(run(engine, prompts, params)[0])
        assert spec.num_sampled_one_wait_rounds > 0 and spec.graphs.num_replays > replays
    assert outs[0] == outs[1] and all(len(t) == 24 for t in outs[0])


def test_bench_sampled_round_runs():
    from engine.testing.bench.spec import make_spec_runner, run_spec_rounds

    model = loaded("dense").model
    runner = make_spec_runner(model, 64, 2, "bf16", 3, 1024)
    assert runner.spec_graphs_captured and runner.spec is not None
    params = default_sampling(moe=False, thinking=False)
    got = run_spec_rounds(runner, model.config.vocab_size, 2, 200, 2, 4, 3, params)
    assert got["round_s"] > 0 and got["tokens_per_round"] >= 1.0
    assert got["graph_replays_per_round"] >= 4  # the verify, the catch-up and K - 1 draft steps
    assert runner.spec.num_sampled_one_wait_rounds == 5  # every round but the width-1 first step
