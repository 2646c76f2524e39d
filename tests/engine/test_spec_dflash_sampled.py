"""The sampled one-wait DFlash round (engine/runner/dflash_round.py `run_dflash_sampled`, the verdict and copy of
engine/runner/spec_sampled.py) on the tiny MoE with its tiny companion (float32, CPU):

- the sampling invariant through the runner: the first two tokens a request commits after its first one, over
  rounds of DFlash drafts verified on the device, are distributed as sampling the target one token at a time
  (chi-square, significance 0.1%), with temperature, top-k, top-p, min-p and presence / frequency penalties; the
  drafts themselves fail the same test (power). The target and the companion share one output head; here it is
  restricted to a few token ids (`_small_head`), so the distribution has few cells and its draws are cheap;
- drafts that always agree commit K + 1 tokens a round, drafts the target never emits commit one, a sampled row
  beside greedy ones;
- rows whose sampling is deterministic (top-k 1 at a temperature, greedy with penalties) commit, roll back, draft and
  leave the GDN state and the drafter's context KV exactly as the general round does, drafts accepted in full, in
  part and not at all; greedy penalized requests decode to the plain engine's tokens; the server's preset takes the
  round and a seed reproduces.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

import pytest
import torch
from engine_harness import one_thread, prompt, run
from test_spec_dflash_engine import LENGTHS, _loaded, core
from test_spec_dflash_graphs import context_kv, dflash_runner
from test_spec_one_wait import PROMPTS, Lanes
from test_spec_verify import _chi_square_p_value

from engine.model.forward import allocate_model_cache, make_forward_batch
from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.sampling import output_token_counts, processed_distribution
from engine.spec.dflash_draft import DFlashDrafter
from engine.spec.dflash_graphs import DFlashGraphs
from engine.spec.graphs import SpecGraphs
from engine.step import RowPlan, StepPlan, StepResult
from engine.testing.bench.spec import make_spec_runner

K = 2
SMALL = (
    1000,
    2000,
    3000,
    4000,
    5000,
    6000,
)  # the restricted head's rows: token i of its vocabulary is row SMALL[i]
V = len(SMALL)
PROMPT = (7, 11, 13, 17, 19, 23, 29, 31, 37)
LANES = 128
# every warper at once (the chi-square test through the model costs ~10 s a case on the CPU)
PARAMS = SamplingParams(
    temperature=0.9, top_k=5, top_p=0.95, min_p=0.05, presence_penalty=0.6, frequency_penalty=0.4
)
TRIALS = 12  # batches of LANES requests: 1,536 pairs


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def _small_head(model: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """The model's output head restricted to the rows SMALL, scaled up (the tiny model's logits are small): logits
    [N, V] whose column i is token id i, which the model then embeds as any other token id."""
    weight = (model.lm_head.weight if model.lm_head is not None else model.model.embed_tokens.weight)[
        torch.tensor(SMALL)
    ]

    def compute_logits(hidden: torch.Tensor, indices: torch.Tensor | None = None) -> torch.Tensor:
        rows = hidden if indices is None else hidden[indices]
        return 1.5 * (rows.float() @ weight.float().T)

    monkeypatch.setattr(model, "compute_logits", compute_logits)


def _wide_runner() -> ModelRunner:
    """A DFlash runner of LANES lanes whose static buffers hold every batch of 1 .. LANES rows (the engine's hold 8;
    on the CPU they run eagerly, so wider buffers only spread a trial over fewer steps)."""
    runner = make_spec_runner(_loaded().model, LANES, LANES, "bf16", K, 64, cuda_graph=False, spec="dflash")
    spec = runner.spec
    assert spec is not None and isinstance(spec.drafter, DFlashDrafter)
    sizes = range(1, LANES + 1)
    spec.graphs = SpecGraphs(spec.model, runner.cache, num_draft_tokens=K, max_pages=1, sizes=sizes,
                             feature_layers=spec.feature_layers, widths=(1, K + 1), with_mtp=False)  # fmt: skip
    spec.draft_graphs = DFlashGraphs(spec.drafter, num_draft_tokens=K, max_pages=1, sizes=sizes)
    return runner


class Trials:
    """Requests of one prompt, LANES at a time, on one runner: prefill (its first token and K drafts with their q),
    then sampled rounds until each has committed two more tokens."""

    def __init__(self, runner: ModelRunner, params: SamplingParams) -> None:
        self.runner, self.params, self.step, self.done = runner, params, 0, 0
        self.released: tuple[str, ...] = ()
        self.accepted: list[int] = []  # drafts accepted per row and round

    def _execute(self, rows: list[RowPlan]) -> StepResult:
        self.step += 1
        result = self.runner.execute(StepPlan(self.step, tuple(rows), (), self.released))
        self.released = ()
        return result

    def _row(self, lane: int, request: str, fed: tuple[int, ...], start: int, n_out: int) -> RowPlan:
        cold = start == 0
        return RowPlan(request, lane, fed, start, (lane,), lane, cold, None, None, 1 if cold else len(fed),
                       self.params, n_out)  # fmt: skip

    def run(self) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
        """One batch of LANES requests: (the two tokens after the first, the prefill's first two drafts) each."""
        ids = [f"t{self.done}-{i}" for i in range(LANES)]
        self.done += 1
        first = self._execute([self._row(i, r, PROMPT, 0, 0) for i, r in enumerate(ids)])
        out = [list(t) for t in first.sampled_token_ids]
        drafts = [tuple(d) for d in first.draft_token_ids]
        prefill_drafts = [(d[0], d[1]) for d in drafts]
        live = list(range(LANES))
        while live:  # rows still short of two tokens after the first, one width: the sampled one-wait round
            rows = [self._row(i, ids[i], (out[i][-1], *drafts[i]), len(PROMPT) + len(out[i]) - 1, len(out[i]))
                    for i in live]  # fmt: skip
            result = self._execute(rows)
            self.accepted += result.num_accepted
            for i, tokens, new in zip(live, result.sampled_token_ids, result.draft_token_ids, strict=True):
                out[i] += tokens
                drafts[i] = tuple(new)
            live = [i for i in live if len(out[i]) < 3]
        self.released = tuple(ids)
        return [(o[1], o[2]) for o in out], prefill_drafts


def _expected_pairs(params: SamplingParams) -> torch.Tensor:
    """P(t1, t2) [V, V] of the two tokens after the first when sampling the target one token at a time: the sum over
    the first token t0 of P(t0) P(t1 | t0) P(t2 | t0 t1), each from the processed distribution with the penalty
    counts of the output before it."""
    model = _loaded().model

    def dist(outputs: list[list[int]]) -> torch.Tensor:
        cache = allocate_model_cache(model.config, len(outputs), 64, num_state_slots=len(outputs),
                                     dtype=torch.float32)  # fmt: skip
        seqs = [list(PROMPT) + o for o in outputs]
        batch = make_forward_batch(
            seqs, [0] * len(seqs), [[i] for i in range(len(seqs))], list(range(len(seqs)))
        )
        with torch.inference_mode():
            hidden = model(batch, cache)
            ends = torch.tensor([len(s) for s in seqs]).cumsum(0) - 1
            logits = model.compute_logits(hidden, ends)
        _, probs = processed_distribution(logits, [params] * len(outputs), output_token_counts(outputs, V))
        assert probs is not None
        return probs.double()

    p0 = dist([[]])[0]
    p1 = dist([[t] for t in range(V)])  # [t0, V]
    p2 = dist([[t, u] for t in range(V) for u in range(V)]).view(V, V, V)  # [t0, t1, V]
    return (p0[:, None, None] * p1[:, :, None] * p2).sum(dim=0)


def _observed(pairs: list[tuple[int, int]]) -> torch.Tensor:
    index = torch.tensor(pairs)
    out = torch.zeros(V, V, dtype=torch.float64)
    return out.index_put_(
        (index[:, 0], index[:, 1]), torch.ones(len(pairs), dtype=torch.float64), accumulate=True
    )


def test_dflash_sampled_rounds_keep_the_target_distribution(monkeypatch: pytest.MonkeyPatch) -> None:
    params = PARAMS
    _small_head(_loaded().model, monkeypatch)
    runner = _wide_runner()
    trials = Trials(runner, params)
    pairs: list[tuple[int, int]] = []
    drafted: list[tuple[int, int]] = []
    for _ in range(TRIALS):
        got, drafts = trials.run()
        pairs += got
        drafted += drafts
    expected = _expected_pairs(params)
    assert _chi_square_p_value(_observed(pairs), expected) > 1e-3
    # the test has power: the companion's own drafts (q, not p) fail it at the same significance
    draft_only = _observed(drafted)
    assert bool(draft_only[expected == 0].sum() > 0) or _chi_square_p_value(draft_only, expected) < 1e-3
    spec = runner.spec
    assert spec is not None and spec.num_sampled_one_wait_rounds == spec.num_one_wait_rounds >= TRIALS
    assert {0, K} <= set(trials.accepted), trials.accepted  # drafts rejected at once, and accepted in full


# ---- through the runner at the engine's sizes ------------------------------------------------------------------

TOP1 = SamplingParams(
    temperature=0.7, top_k=1, presence_penalty=0.0
)  # sampled, but only the argmax can come out
NO_PENALTY_GREEDY = SamplingParams(temperature=0.0, presence_penalty=0.0)
TOP5 = SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.0)


class RowParamLanes(Lanes):
    """Lanes whose rows sample with their own params (row i: params[i])."""

    def __init__(self, runner: ModelRunner, params: list[SamplingParams], num_pages: int = 3) -> None:
        self.params = params
        super().__init__(runner, num_pages)

    def execute(self, rows: list[RowPlan]) -> StepResult:
        return super().execute([replace(row, sampling_params=self.params[row.lane]) for row in rows])


def _truth(k: int, rounds: int, params: SamplingParams = NO_PENALTY_GREEDY) -> list[list[int]]:
    """Each lane's tokens under deterministic `params` (default greedy, no penalty), enough for `rounds` rounds of k
    drafts."""
    truth = RowParamLanes(dflash_runner(k, "eager", 3), [params] * len(PROMPTS))
    while min(len(o) for o in truth.out) < (rounds + 1) * (k + 1) + 1:
        truth.round(truth.drafts)
    return truth.out


def test_drafts_that_always_agree_give_k_plus_one_tokens_and_drafts_never_emitted_give_one() -> None:
    """A sampled row that can only emit the argmax (top-k 1) and a greedy row, fed the greedy continuation (every
    draft kept: K + 1 tokens, the continuation's) or wrong drafts (none kept: one token, the continuation's), beside
    a sampled top-k 5 row fed drafts its target never emits (none kept, one token a round), all in the sampled
    one-wait round."""
    k, rounds = 3, 4
    want = _truth(k, rounds)
    lanes = RowParamLanes(dflash_runner(k, "one_wait", 3), [TOP1, NO_PENALTY_GREEDY, TOP5])
    assert lanes.out[0] == want[0][:1] and lanes.out[1] == want[1][:1]
    for r in range(rounds):
        agree = r % 2 == 0
        drafts = []
        for i in range(len(PROMPTS)):
            n = len(lanes.out[i])
            good = want[i][n : n + k]
            drafts.append(good if agree and i < 2 else [(t + 1) % 1000 + 3 for t in good])
        result = lanes.round(drafts)
        assert result.num_accepted == ((k, k, 0) if agree else (0, 0, 0)), r
        assert [len(t) for t in result.sampled_token_ids] == ([k + 1, k + 1, 1] if agree else [1, 1, 1])
        for i in range(2):
            assert lanes.out[i] == want[i][: len(lanes.out[i])], (r, i)
    spec = lanes.runner.spec
    assert spec is not None and spec.num_sampled_one_wait_rounds == rounds


# sampled rows whose draws cannot differ (top-k 1), and a greedy penalized row; negative penalties make the tokens
# already in the output win, so every count decides tokens
DETERMINISTIC = {
    "top_k1_presence": SamplingParams(
        temperature=0.7, top_k=1, presence_penalty=-2.0, frequency_penalty=-1.0
    ),
    "greedy_presence": SamplingParams(temperature=0.0, presence_penalty=-2.0),
}


@pytest.mark.parametrize("case", list(DETERMINISTIC))
def test_the_sampled_round_commits_rolls_back_and_drafts_as_the_general_round(case: str) -> None:
    """The same plans through the sampled one-wait round and through the general round: per round the same tokens,
    counts and drafts, the same GDN working state and the drafter's context KV before every frontier. Odd rounds give
    row 0 one draft less (two widths: both runners take the general round), so the sampled rounds after them count
    the general round's commits on top of their kept counts."""
    k, rounds = 3, 6
    params = [DETERMINISTIC[case]] * len(PROMPTS)
    want = _truth(k, rounds, params[0])
    lanes = {}
    for flag in (True, False):
        runner = dflash_runner(k, "one_wait", 3)
        assert runner.spec is not None
        runner.spec.one_wait_sampled = flag
        lanes[flag] = RowParamLanes(runner, params)
    seen: set[int] = set()
    for r in range(rounds):
        results = {}
        for flag, lane in lanes.items():
            drafts = lane.mixed_drafts(want, k, r)
            results[flag] = lane.round([d[: k - 1] if r % 2 and i == 0 else d for i, d in enumerate(drafts)])
        on, off = results[True], results[False]
        seen.update(on.num_accepted[1:])
        assert on.sampled_token_ids == off.sampled_token_ids, r
        assert on.num_accepted == off.num_accepted and on.num_rolled_back == off.num_rolled_back, r
        assert on.draft_token_ids == off.draft_token_ids, r
        one, two = lanes[True], lanes[False]
        slots = list(range(len(PROMPTS)))
        for x, y in zip(one.runner.cache.state_stacks, two.runner.cache.state_stacks, strict=True):
            torch.testing.assert_close(x[:, slots], y[:, slots], rtol=1e-5, atol=1e-6)
        for x, y in zip(context_kv(one.runner, one), context_kv(two.runner, two), strict=True):
            torch.testing.assert_close(x, y, rtol=1e-5, atol=1e-6)
    assert {0, k} <= seen, seen
    on_spec, off_spec = lanes[True].runner.spec, lanes[False].runner.spec
    assert on_spec is not None and off_spec is not None
    assert on_spec.num_sampled_one_wait_rounds == rounds // 2 and off_spec.num_one_wait_rounds == 0


def test_greedy_penalized_requests_through_the_sampled_round_equal_plain_decoding() -> None:
    """Invariant 3 with penalties under `--spec dflash`: greedy requests with a presence and a frequency penalty (the
    greedy one-wait round does not take them) decode through the sampled round to the plain engine's tokens."""
    params = SamplingParams(temperature=0.0, presence_penalty=-2.0, frequency_penalty=0.5, max_tokens=16)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    want = run(core(None, prefix_reuse=False, max_concurrency=3), prompts, params)[0]
    for k in (2, 5):
        engine = core(k, max_concurrency=3)
        assert run(engine, prompts, params)[0] == want, k
        spec = engine.runner.spec
        assert spec is not None and spec.num_sampled_one_wait_rounds > 0, k


def test_the_server_preset_takes_the_sampled_round_and_a_seed_reproduces() -> None:
    from engine.sampling import default_sampling

    params = replace(default_sampling(moe=True, thinking=False), seed=5, max_tokens=16)
    prompts = [prompt(n, s) for s, n in enumerate(LENGTHS)]
    outs = []
    for _ in range(2):
        engine = core(3, max_concurrency=3)
        outs.append(run(engine, prompts, params)[0])
        spec = engine.runner.spec
        assert spec is not None and spec.num_sampled_one_wait_rounds > 0
    assert outs[0] == outs[1] and all(len(t) == 16 for t in outs[0])
