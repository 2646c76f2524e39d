"""The sampled one-wait round (engine/runner/spec_sampled.py) and its device-side rejection sampling
(engine/spec/verify.py `verify_on_device`, `draft_on_device`):

- the sampling invariant: rounds of K drafts drawn on the device from a worse drafter and verified on the device emit
  token pairs distributed as sampling the target one token at a time (chi-square on a 6-token vocabulary,
  significance 0.1%), with temperature, top-k, top-p, min-p and presence / frequency penalties;
- a draft that always agrees gives K + 1 tokens, one that never agrees gives 1, greedy rows beside sampled ones
  keep the greedy rule;
- through the runner (tiny dense and MoE models): rows whose sampling is deterministic (top-k 1 at a temperature,
  or greedy, with presence / frequency penalties) take the sampled one-wait round and commit, roll back, draft and leave the GDN
  and MTP state exactly as the general round does, for drafts accepted in full, in part and not at all.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest
import torch
from engine_harness import one_thread
from test_spec_one_wait import PROMPTS, Lanes, _model, _state
from test_spec_verify import CASES, DRAFT, TARGET, V, _chi_square_p_value, _expected_pairs

from engine.request import SamplingParams
from engine.runner import ModelRunner
from engine.sampling import output_token_counts
from engine.spec.verify import draft_on_device, verify_on_device
from engine.step import RowPlan, StepResult
from engine.testing.bench.spec import make_spec_runner

K = 3
DEVICE_CASES = {
    **CASES,
    "presence_top_p": SamplingParams(temperature=0.7, top_p=0.8, top_k=4, presence_penalty=1.5),
    "presence_min_p": SamplingParams(temperature=1.0, min_p=0.1, presence_penalty=0.9),
}


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    with one_thread():
        yield


def _device_round(
    prev: list[int], history: list[list[int]], p: SamplingParams, gen: torch.Generator
) -> list[tuple[int, ...]]:
    """One round on the device functions: K drafts from DRAFT (penalty counts: history + earlier drafts), verified
    against TARGET; each row's committed tokens."""
    n = len(prev)
    params, gens = [p] * n, [gen] * n
    base = output_token_counts(history, V)
    counts, last = base.clone(), torch.tensor(prev)
    drafts, qs = [], []
    for _ in range(K):
        tokens, q = draft_on_device(DRAFT[last], params, gens, counts)
        assert q is not None
        drafts.append(tokens)
        qs.append(q)
        counts = counts.scatter_add(1, tokens[:, None], torch.ones(n, 1))
        last = tokens
    fed = torch.stack([torch.tensor(prev), *drafts], dim=1)  # [n, K + 1]
    logits = TARGET[fed.flatten()]
    accepted, bonus = verify_on_device(logits, fed, list(torch.stack(qs, dim=1)), params, gens, base)
    return [
        (*f[1 : a + 1], b) for f, a, b in zip(fed.tolist(), accepted.tolist(), bonus.tolist(), strict=True)
    ]


@pytest.mark.parametrize("case", list(DEVICE_CASES))
def test_device_rejection_sampling_keeps_the_target_distribution(case: str) -> None:
    p = DEVICE_CASES[case]
    gen = torch.Generator().manual_seed(11)
    n = 6_000
    first = _device_round([0] * n, [[] for _ in range(n)], p, gen)
    short = [i for i, t in enumerate(first) if len(t) < 2]
    second = (
        _device_round([first[i][0] for i in short], [[first[i][0]] for i in short], p, gen) if short else []
    )
    pairs = [t[:2] for t in first]
    for i, t in zip(short, second, strict=True):
        pairs[i] = (first[i][0], t[0])
    index = torch.tensor(pairs)
    observed = torch.zeros(V, V, dtype=torch.float64)
    observed.index_put_((index[:, 0], index[:, 1]), torch.ones(n, dtype=torch.float64), accumulate=True)
    assert _chi_square_p_value(observed, _expected_pairs(p).double()) > 1e-3, case
    assert 0 < len(short) < n  # drafts were rejected and accepted


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_draft_that_always_agrees_gives_k_plus_one_tokens_one_that_never_does_one(k: int) -> None:
    """Sampled rows (q = p: every draft kept; q on a token p never emits: the first rejected, the token drawn from
    p) beside greedy rows (drafts equal to the argmax or not), in one batch."""
    vocab = 40
    gen = torch.Generator().manual_seed(3)
    sampled = SamplingParams(temperature=0.8, top_k=5)
    greedy = SamplingParams(temperature=0.0)
    logits = torch.randn(k + 1, vocab, generator=gen)
    from engine.sampling import processed_distribution

    argmax, p = processed_distribution(logits, [sampled] * (k + 1))
    assert p is not None
    outside = int(p[0].argmin())  # top-k 5 of 40: p is 0 there
    drafts_agree = [int(t) for t in torch.multinomial(p[:k], 1, generator=gen)[:, 0]]
    fed = torch.tensor(
        [[1, *drafts_agree], [1, *[outside] * k], [1, *argmax[:k].tolist()], [1, *[outside] * k]]
    )
    q_never = torch.zeros(k, vocab)
    q_never[:, outside] = 1.0
    params = [sampled, sampled, greedy, greedy]
    gens = [gen, gen, None, None]
    got = {"agree": 0, "never": 0}
    for _ in range(20):
        accepted, bonus = verify_on_device(
            logits.repeat(4, 1), fed, [p[:k], q_never, None, None], params, gens
        )
        a = accepted.tolist()
        assert a == [k, 0, k, 0]
        b = bonus.tolist()
        assert p[k, b[0]] > 0 and p[0, b[1]] > 0  # drawn from p_k, and from the residual (= p_0)
        assert b[2:] == [int(argmax[k]), int(argmax[0])]
        got["agree"] += a[0] + 1
        got["never"] += a[1] + 1
    assert got == {"agree": 20 * (k + 1), "never": 20}


# ---- through the runner ----------------------------------------------------------------------------------------

# sampled rows whose draws cannot differ (top-k 1), and a greedy penalized row; negative penalties make the tokens
# already in the output win, so every count (the history, the drafts kept, the bonus, the drafts before) decides
# tokens (with a 248k vocabulary a positive penalty almost never meets a token it counted)
DETERMINISTIC = {
    "top_k1_presence": SamplingParams(
        temperature=0.7, top_k=1, presence_penalty=-2.0, frequency_penalty=-1.0
    ),
    "greedy_presence": SamplingParams(temperature=0.0, presence_penalty=-2.0),
}


class ParamLanes(Lanes):
    def __init__(self, runner: ModelRunner, params: SamplingParams, num_pages: int = 2) -> None:
        self.params = params
        super().__init__(runner, num_pages)

    def execute(self, rows: list[RowPlan]) -> StepResult:
        return super().execute([replace(row, sampling_params=self.params) for row in rows])


def _runner(arch: str, sampled_one_wait: bool) -> ModelRunner:
    runner = make_spec_runner(_model(arch), len(PROMPTS) * 2, len(PROMPTS), "bf16", K, 128, cuda_graph=False)
    assert runner.spec is not None
    runner.spec.one_wait_sampled = sampled_one_wait
    return runner


@pytest.mark.parametrize("arch", ["dense", "moe"])
@pytest.mark.parametrize("case", list(DETERMINISTIC))
def test_the_sampled_round_commits_rolls_back_and_drafts_as_the_general_round(arch: str, case: str) -> None:
    """Odd rounds give row 0 one draft less (two widths: the general round), so the sampled rounds after them count
    tokens committed by the general round on top of their kept counts."""
    params = DETERMINISTIC[case]
    truth = ParamLanes(_runner(arch, False), params)
    while min(len(o) for o in truth.out) < 6 * (K + 1) + 1:
        truth.round(truth.drafts)
    want = truth.out
    lanes = {flag: ParamLanes(_runner(arch, flag), params) for flag in (True, False)}
    seen: set[int] = set()
    for r in range(6):
        results = {}
        for flag, lane in lanes.items():
            drafts = lane.mixed_drafts(want, K, r)
            results[flag] = lane.round([d[: K - 1] if r % 2 and i == 0 else d for i, d in enumerate(drafts)])
        on, off = results[True], results[False]
        seen.update(on.num_accepted[1:])
        assert on.sampled_token_ids == off.sampled_token_ids
        assert on.num_accepted == off.num_accepted and on.num_rolled_back == off.num_rolled_back
        assert on.draft_token_ids == off.draft_token_ids
        for a, b in zip(_state(lanes[True].runner), _state(lanes[False].runner), strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert {0, K} <= seen, seen
    on_spec, off_spec = lanes[True].runner.spec, lanes[False].runner.spec
    assert on_spec is not None and off_spec is not None
    assert on_spec.num_sampled_one_wait_rounds == 3 and off_spec.num_sampled_one_wait_rounds == 0
    assert lanes[True].out[0][: len(want[0])] == want[0][: len(lanes[True].out[0])]


def test_a_sampled_row_whose_drafts_have_no_q_takes_the_general_round() -> None:
    """Sampled rows whose drafts came from the MTP head take the sampled round; drafts without their q (the q
    forgotten here) do not (the general round then refuses them: it needs q as well)."""
    runner = _runner("dense", True)
    lanes = ParamLanes(runner, SamplingParams(temperature=0.9, top_p=0.9, presence_penalty=1.5))
    spec = runner.spec
    assert spec is not None
    lanes.round(lanes.drafts)
    assert spec.num_sampled_one_wait_rounds == 1
    spec.release([f"r{i}" for i in range(len(PROMPTS))])
    with pytest.raises(AssertionError, match="without their q"):
        lanes.round(lanes.drafts)
    assert spec.num_sampled_one_wait_rounds == 1


def test_the_switch_is_read_when_a_runner_is_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """NINFER_SPEC_ONE_WAIT_SAMPLED: on (the default) or off, normalised; anything else refused with the variable
    named; a speculative runner takes its reading."""
    from engine import env

    monkeypatch.delenv("NINFER_SPEC_ONE_WAIT_SAMPLED", raising=False)
    assert env.spec_one_wait_sampled() is True
    monkeypatch.setenv("NINFER_SPEC_ONE_WAIT_SAMPLED", " OFF")
    assert env.spec_one_wait_sampled() is False
    spec = make_spec_runner(_model("dense"), 2, 1, "bf16", K, 128, cuda_graph=False).spec
    assert spec is not None and spec.one_wait_sampled is False
    monkeypatch.setenv("NINFER_SPEC_ONE_WAIT_SAMPLED", "1")
    with pytest.raises(ValueError, match=r"^NINFER_SPEC_ONE_WAIT_SAMPLED='1': expected 'on', 'off'$"):
        env.spec_one_wait_sampled()


@pytest.mark.parametrize("arch", ["dense", "moe"])
def test_greedy_penalized_rows_through_the_sampled_round_equal_plain_decoding(arch: str) -> None:
    """Invariant 3 with penalties: greedy rows with a presence and a frequency penalty (the greedy one-wait round
    does not take them) decode through the sampled round to exactly the plain engine's tokens, batched."""
    from engine_harness import prompt, run
    from test_spec_engine import spec_core

    params = SamplingParams(temperature=0.0, presence_penalty=-2.0, frequency_penalty=0.5, max_tokens=16)
    prompts = [prompt(n, s) for s, n in enumerate((5, 17, 40))]
    want = run(spec_core(arch, None, max_concurrency=3), prompts, params)[0]
    core = spec_core(arch, 3, max_concurrency=3)
    assert run(core, prompts, params)[0] == want
    spec = core.runner.spec
    assert spec is not None and spec.num_sampled_one_wait_rounds > 0


def test_the_server_presets_take_the_sampled_round_and_a_seed_reproduces() -> None:
    """The non-thinking preset (temperature 0.7, top-p 0.8, top-k 20, presence penalty 1.5) with a seed: the
    sampled one-wait round runs, and the same seed gives the same tokens."""
    from engine_harness import prompt, run
    from test_spec_engine import spec_core

    from engine.sampling import default_sampling

    params = replace(default_sampling(moe=False, thinking=False), seed=5, max_tokens=16)
    prompts = [prompt(n, s) for s, n in enumerate((9, 30))]
    outs = []
    for _ in range(2):
        core = spec_core("dense", 3, max_concurrency=2)
        outs.append(run(core, prompts, params)[0])
        spec = core.runner.spec
        assert spec is not None and spec.num_sampled_one_wait_rounds > 0
    assert outs[0] == outs[1] and all(len(t) == 16 for t in outs[0])
