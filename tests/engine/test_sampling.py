"""Sampler: greedy, temperature, top-k/p, min-p, penalties, per-request seeds; presets and precedence."""

from __future__ import annotations

import pytest
import torch

from engine.request import SamplingParams
from engine.sampling import (
    Sampler,
    default_sampling,
    filter_logits,
    output_token_counts,
    resolve_sampling,
)

VOCAB = 50


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, VOCAB, generator=torch.Generator().manual_seed(seed))


def _draws(
    sampler: Sampler, logits: torch.Tensor, params: SamplingParams, n: int, rid: str = "r"
) -> list[int]:
    return [int(sampler.sample(logits, [params], [rid])[0]) for _ in range(n)]


def test_greedy_is_argmax_per_row() -> None:
    logits = _logits(4)
    out = Sampler(seed=0).sample(logits, [SamplingParams(temperature=0.0)] * 4, list("abcd"))
    assert out.tolist() == logits.argmax(-1).tolist()


def test_mixed_batch_keeps_greedy_rows_greedy() -> None:
    logits = _logits(3, seed=1)
    params = [
        SamplingParams(temperature=0.0),
        SamplingParams(temperature=1.5, seed=3),
        SamplingParams(temperature=0),
    ]
    out = Sampler(seed=0).sample(logits, params, ["a", "b", "c"])
    assert out[0] == logits[0].argmax() and out[2] == logits[2].argmax()


def test_top_k_one_and_tiny_top_p_and_min_p_one_always_pick_the_top_token() -> None:
    logits = _logits(1, seed=2)
    top = int(logits.argmax())
    sampler = Sampler(seed=0)
    for params in (
        SamplingParams(temperature=1.0, top_k=1),
        SamplingParams(temperature=1.0, top_p=1e-6),
        SamplingParams(temperature=1.0, min_p=1.0),
    ):
        assert set(_draws(sampler, logits, params, 30)) == {top}, params


def test_filter_logits_keeps_exactly_the_expected_sets() -> None:
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    logits = probs.log()
    kept = lambda k, p, m: torch.isfinite(  # noqa: E731
        filter_logits(logits, torch.tensor([k]), torch.tensor([p]), torch.tensor([m]))
    )[0].tolist()
    assert kept(2, 1.0, 0.0) == [True, True, False, False]
    assert kept(0, 0.8, 0.0) == [True, True, False, False]  # 0.5 + 0.3 reaches 0.8
    assert kept(0, 0.81, 0.0) == [True, True, True, False]
    assert kept(0, 1.0, 0.25) == [True, True, True, False]  # 0.05 < 0.25 * 0.5
    assert kept(3, 1.0, 0.5) == [True, True, False, False]


def test_temperature_sampling_follows_the_softmax() -> None:
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    draws = _draws(Sampler(seed=123), logits, SamplingParams(temperature=1.0), 4000)
    freq = [draws.count(i) / len(draws) for i in range(4)]
    want = torch.softmax(logits[0], -1).tolist()
    assert all(abs(f - w) < 0.03 for f, w in zip(freq, want, strict=True)), (freq, want)
    cold = _draws(Sampler(seed=123), logits, SamplingParams(temperature=0.1), 500)
    assert cold.count(0) > 490  # low temperature concentrates on the top token


def test_seeded_request_repeats_exactly_whatever_else_is_in_the_batch() -> None:
    logits = _logits(3, seed=4)
    params = SamplingParams(temperature=1.0, seed=42)
    alone = Sampler(seed=1)
    solo = [int(alone.sample(logits[:1], [params], ["me"])[0]) for _ in range(20)]
    batched = Sampler(seed=2)
    other = SamplingParams(temperature=1.0)
    rows = torch.stack([logits[1], logits[0], logits[2]])
    got = [int(batched.sample(rows, [other, params, other], ["x", "me", "y"])[1]) for _ in range(20)]
    assert got == solo
    assert len(set(solo)) > 1  # it really samples
    batched.release(["me"])
    again = [int(batched.sample(logits[:1], [params], ["me"])[0]) for _ in range(20)]
    assert again == solo  # a released id starts over from its seed


def test_presence_and_frequency_penalties_push_repeated_tokens_down() -> None:
    logits = torch.tensor([[3.0, 2.5, 0.0, 0.0]])
    counts = output_token_counts([[0, 0, 0]], 4)
    assert counts[0].tolist() == [3.0, 0.0, 0.0, 0.0]
    sampler = Sampler(seed=0)
    greedy = SamplingParams(temperature=0.0)
    assert int(sampler.sample(logits, [greedy], ["r"], counts)[0]) == 0
    presence = SamplingParams(temperature=0.0, presence_penalty=1.0)
    assert int(sampler.sample(logits, [presence], ["r"], counts)[0]) == 1  # 3 - 1 < 2.5
    frequency = SamplingParams(temperature=0.0, frequency_penalty=0.2)
    assert int(sampler.sample(logits, [frequency], ["r"], counts)[0]) == 1  # 3 - 0.6 < 2.5
    negative = SamplingParams(temperature=0.0, presence_penalty=-1.0)
    assert int(sampler.sample(torch.tensor([[2.0, 2.5, 0, 0]]), [negative], ["r"], counts)[0]) == 0


def test_presets_match_the_issue() -> None:
    def five(p: SamplingParams) -> tuple:
        return (p.temperature, p.top_p, p.top_k, p.min_p, p.presence_penalty)

    assert five(default_sampling(moe=False, thinking=True)) == (1.0, 0.95, 20, 0.0, 0.0)
    assert five(default_sampling(moe=False, thinking=False)) == (0.7, 0.8, 20, 0.0, 1.5)
    assert five(default_sampling(moe=True, thinking=True)) == (1.0, 0.95, 20, 0.0, 1.5)
    assert five(default_sampling(moe=True, thinking=False)) == (0.7, 0.8, 20, 0.0, 1.5)


def test_resolution_order_preset_then_server_then_request_and_greedy_forces() -> None:
    preset = default_sampling(moe=False, thinking=True)
    server = SamplingParams(temperature=0.6, top_k=10)
    req = SamplingParams(temperature=0.9, max_tokens=7)
    got = resolve_sampling(req, preset=preset, server=server)
    assert (got.temperature, got.top_k, got.top_p, got.max_tokens) == (0.9, 10, 0.95, 7)
    assert resolve_sampling(req, preset=preset, server=server, greedy=True).temperature == 0.0
    assert resolve_sampling(SamplingParams(), preset=preset).temperature == 1.0


def test_every_filter_on_still_samples_from_the_top_k() -> None:
    logits = _logits(2, seed=5) * 50
    params = [SamplingParams(temperature=2.0, top_k=3, top_p=0.5, min_p=0.3, seed=s) for s in (1, 2)]
    out = Sampler(seed=0).sample(logits, params, ["a", "b"])
    top3 = logits.topk(3, dim=-1).indices
    assert all(int(out[i]) in top3[i].tolist() for i in range(2))


def test_rows_must_match_params() -> None:
    with pytest.raises(AssertionError, match="one row per request"):
        Sampler().sample(_logits(2), [SamplingParams()], ["a"])


@pytest.mark.parametrize("seed", range(4))
def test_top_k_candidates_filter_like_the_full_sort(seed: int) -> None:
    """Rows that all have a top-k select their top-k candidates (no full-vocabulary sort): the same kept
    tokens and the same logits as the sorted path, with top-p and min-p on top, for every mix of rows."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, 3000, generator=gen) * 3
    top_k = torch.tensor([1, 5, 20, 20, 64, 1024])
    top_p = torch.tensor([1.0, 0.9, 0.95, 0.5, 1.0, 0.8])
    min_p = torch.tensor([0.0, 0.0, 0.05, 0.0, 0.2, 0.0])
    full = filter_logits(logits, top_k, top_p, min_p)
    fast = filter_logits(logits, top_k, top_p, min_p, int(top_k.max()))
    assert torch.equal(torch.isfinite(fast), torch.isfinite(full))
    assert torch.equal(fast[torch.isfinite(fast)], full[torch.isfinite(full)])
    assert torch.isfinite(full).sum(dim=-1).tolist()[0] == 1 and (torch.isfinite(full).sum(-1) <= top_k).all()


def test_sampler_with_and_without_a_top_k_row_draws_the_same_tokens() -> None:
    """The candidate path is an optimisation only: a seeded request draws the same tokens whether its
    batch takes it (every row has a top-k) or the full sort (a row without top-k joins the batch)."""
    logits = torch.randn(2, 5000, generator=torch.Generator().manual_seed(7)) * 2
    a = SamplingParams(temperature=1.0, top_k=20, top_p=0.95, seed=11)
    b_topk, b_none = (
        SamplingParams(temperature=0.8, top_k=40, seed=12),
        SamplingParams(temperature=0.8, seed=12),
    )
    sampler_fast, sampler_full = Sampler(seed=0), Sampler(seed=0)
    fast = [sampler_fast.sample(logits, [a, b_topk], ["a", "b"])[0].item() for _ in range(20)]
    full = [sampler_full.sample(logits, [a, b_none], ["a", "b"])[0].item() for _ in range(20)]
    assert fast == full and len(set(fast)) > 1
