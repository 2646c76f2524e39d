"""Speculative verification (engine/spec/verify.py): greedy acceptance counts, and that rejection
sampling keeps the target distribution exactly (a chi-square test on a tiny vocabulary, significance
0.1%), with temperature, top-k, top-p, min-p and a frequency penalty in the processed distribution."""

from __future__ import annotations

import pytest
import torch

from engine.request import SamplingParams
from engine.sampling import output_token_counts, processed_distribution
from engine.spec.verify import draft_tokens, verify

V = 6
GREEDY = SamplingParams(temperature=0.0)


def _one_hot_logits(tokens: list[int], vocab: int = 50) -> torch.Tensor:
    logits = torch.full((len(tokens), vocab), -5.0)
    logits[torch.arange(len(tokens)), torch.tensor(tokens)] = 5.0
    return logits


def _gen(_request_id: str, _seed: int | None) -> torch.Generator:
    return torch.Generator().manual_seed(0)


@pytest.mark.parametrize("k", [1, 2, 3, 4, 5])
def test_a_draft_that_always_agrees_yields_k_plus_one_tokens(k):
    target = [7, 8, 9, 10, 11, 12][: k + 1]  # the target's argmax at each verified position
    verdict = verify(_one_hot_logits(target), [target[:k]], [None], [GREEDY], ["r"], _gen)[0]
    assert verdict.num_accepted == k and verdict.tokens == tuple(target)


@pytest.mark.parametrize("k", [1, 3, 5])
def test_a_draft_that_never_agrees_yields_one_token(k):
    target = [7, 8, 9, 10, 11, 12][: k + 1]
    wrong = [t + 20 for t in target[:k]]
    verdict = verify(_one_hot_logits(target), [wrong], [None], [GREEDY], ["r"], _gen)[0]
    assert verdict.num_accepted == 0 and verdict.tokens == (7,)


def test_greedy_stops_at_the_first_mismatch_and_rows_are_independent():
    rows = [[1, 2, 3, 4], [5, 6], [9]]  # per row the target argmax at its positions
    drafts = [[1, 2, 30], [5], []]  # row 0: 2 accepted, row 1: all accepted, row 2: no drafts
    logits = _one_hot_logits([t for r in rows for t in r])
    out = verify(logits, drafts, [None] * 3, [GREEDY] * 3, ["a", "b", "c"], _gen)
    assert [(v.tokens, v.num_accepted) for v in out] == [((1, 2, 3), 2), ((5, 6), 1), ((9,), 0)]


def test_greedy_verification_reads_the_penalized_argmax():
    """A presence penalty moves the argmax; at position 1 the penalty also counts the first draft."""
    logits = torch.tensor([[3.0, 2.9, 0.0], [3.0, 2.9, 0.0]])
    params = SamplingParams(temperature=0.0, presence_penalty=1.0)
    out = verify(logits, [[0]], [None], [params], ["r"], _gen, history=[[]])[0]
    # position 0: no history, argmax 0 = the draft (accepted); position 1: token 0 penalized -> 1
    assert out.tokens == (0, 1) and out.num_accepted == 1


# ---- the sampling invariant ---------------------------------------------------------------------

K = 3
TARGET = torch.randn(V, V, generator=torch.Generator().manual_seed(1)) * 1.5  # logits of next | previous
DRAFT = TARGET + torch.randn(V, V, generator=torch.Generator().manual_seed(2)) * 1.2  # a worse drafter
CASES = {
    "temperature": SamplingParams(temperature=0.9),
    "top_k": SamplingParams(temperature=1.0, top_k=3),
    "top_k_top_p": SamplingParams(temperature=1.0, top_k=4, top_p=0.85),
    "min_p": SamplingParams(temperature=1.2, min_p=0.12),
    "penalty_top_p": SamplingParams(temperature=0.8, top_p=0.9, frequency_penalty=0.8),
}


def _dist(table: torch.Tensor, prev: list[int], history: list[list[int]], p: SamplingParams) -> torch.Tensor:
    counts = output_token_counts(history, V)
    _, probs = processed_distribution(table[torch.tensor(prev)], [p] * len(prev), counts)
    assert probs is not None
    return probs


def _speculative_pairs(p: SamplingParams, n: int, seed: int) -> torch.Tensor:
    """The first two tokens after token 0, from rounds of K drafts verified against the target."""
    gen = torch.Generator().manual_seed(seed)

    def g(_r: str, _s: int | None) -> torch.Generator:
        return gen

    def round_from(prev: list[int], history: list[list[int]]) -> list[tuple[int, ...]]:
        drafts: list[list[int]] = [[] for _ in prev]
        qs = []
        last = list(prev)
        for _ in range(K):
            hist = [h + d for h, d in zip(history, drafts, strict=True)]
            counts = output_token_counts(hist, V)
            toks, q = draft_tokens(DRAFT[torch.tensor(last)], [p] * len(prev), ["r"] * len(prev), g, hist)
            assert q is not None and counts.shape[0] == len(prev)
            qs.append(q)
            for d, t in zip(drafts, toks, strict=True):
                d.append(t)
            last = toks
        q_rows = torch.stack(qs, dim=1)  # [n, K, V]
        contexts = [[x, *d] for x, d in zip(prev, drafts, strict=True)]  # the token before each position
        logits = TARGET[torch.tensor([t for c in contexts for t in c])]
        out = verify(logits, drafts, list(q_rows), [p] * len(prev), ["r"] * len(prev), g, history)
        return [v.tokens for v in out]

    first = round_from([0] * n, [[] for _ in range(n)])
    short = [i for i, t in enumerate(first) if len(t) < 2]
    second = round_from([first[i][0] for i in short], [[first[i][0]] for i in short]) if short else []
    pairs = [t[:2] for t in first]
    for i, t in zip(short, second, strict=True):
        pairs[i] = (first[i][0], t[0])
    return torch.tensor(pairs)


def _expected_pairs(p: SamplingParams) -> torch.Tensor:
    """P(t1, t2 | 0) when sampling one token at a time from the processed target distribution."""
    p1 = _dist(TARGET, [0], [[]], p)[0]
    p2 = _dist(TARGET, list(range(V)), [[t] for t in range(V)], p)  # [t1, V]
    return p1[:, None] * p2


def _chi_square_p_value(observed: torch.Tensor, expected_probs: torch.Tensor) -> float:
    n = observed.sum()
    expected = expected_probs * n
    assert observed[expected_probs == 0].sum() == 0, "a token pair the target never emits was emitted"
    keep = expected_probs > 0
    stat = ((observed[keep] - expected[keep]) ** 2 / expected[keep]).sum()
    dof = int(keep.sum()) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2.0, dtype=torch.float64), stat.double() / 2))


@pytest.mark.parametrize("case", list(CASES))
def test_speculative_sampling_keeps_the_target_distribution(case):
    p = CASES[case]
    pairs = _speculative_pairs(p, n=6_000, seed=7)
    observed = torch.zeros(V, V, dtype=torch.float64)
    observed.index_put_(
        (pairs[:, 0], pairs[:, 1]), torch.ones(len(pairs), dtype=torch.float64), accumulate=True
    )
    expected = _expected_pairs(p).double()
    assert _chi_square_p_value(observed, expected) > 1e-3, f"{case}: speculative pairs differ from the target"
    # The test has power: the drafter's own distribution is rejected (it emits pairs the target never
    # does, or fails the chi-square at the same significance).
    q1 = _dist(DRAFT, [0], [[]], p)[0]
    q2 = _dist(DRAFT, list(range(V)), [[t] for t in range(V)], p)
    draft_only = torch.round((q1[:, None] * q2).double() * len(pairs))
    assert bool(draft_only[expected == 0].sum() > 0) or _chi_square_p_value(draft_only, expected) < 1e-3


def test_structured_and_logprobs_requests_under_spec_match_the_plain_engine():
    """Grammar-constrained and logprobs rows never draft under --spec mtp (one token per step through the
    runner's sampler): their output is valid and equal to the plain engine's, beside a drafting free row."""
    import json

    import jsonschema
    from engine_harness import one_thread, tiny_artifact
    from test_structured import SCHEMA as schema  # its greedy answer on this model closes within 300 tokens

    from engine import LLM
    from engine.structured import json_schema_spec

    spec = json_schema_spec(schema, strict=True)
    params = [
        SamplingParams(temperature=0.0, max_tokens=300, structured=spec),
        SamplingParams(temperature=0.0, max_tokens=10, logprobs=2),
        SamplingParams(temperature=0.0, max_tokens=10),
    ]
    prompts = ["Describe a colour", "Another", "Free text here"]
    with one_thread():
        plain = LLM(tiny_artifact("dense"), max_context=512, max_concurrency=3, device="cpu")
        want = plain.generate(prompts, params)
        fast = LLM(
            tiny_artifact("dense"),
            max_context=512,
            max_concurrency=3,
            device="cpu",
            spec="mtp",
            draft_tokens=3,
        )
        got = fast.generate(prompts, params)
    assert [o.token_ids for o in got] == [o.token_ids for o in want]
    assert got[0].finish_reason == "stop"
    jsonschema.validate(json.loads(got[0].text), schema)
    stats = fast.core.scheduler.spec_stats
    assert stats.rounds > 0  # the free row drafted
