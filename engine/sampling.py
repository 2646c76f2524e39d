"""Sampler: logits -> next token ids, batched over rows with per-row parameters; sampling presets.

Owns: the sampling math (penalties, temperature, top-k, top-p, min-p, greedy) and the per-request
seeded generators. Must not touch requests or the scheduler: the runner passes logits, each row's
`SamplingParams` and request id, and (for penalties) each row's output-token counts.

Order of the warpers follows HF transformers (the reference oracle): penalties on the raw logits,
then temperature, top-k, top-p, min-p. temperature 0 is greedy: argmax of the penalized logits.
Sampling uses the exponential race (argmax of probs / Exp(1) noise), drawn per row from that row's
generator: a request with a `seed` owns a generator seeded once, so its tokens depend only on its own
logits and seed, never on which other requests share the batch.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch

from engine.request import SamplingParams

# Default sampling by model family and thinking mode (issue 4; Qwen's model cards).
_NON_THINKING = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, min_p=0.0, presence_penalty=1.5)
SAMPLING_PRESETS: dict[tuple[str, bool], SamplingParams] = {
    ("dense", True): SamplingParams(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=0.0),
    ("dense", False): _NON_THINKING,
    ("moe", True): SamplingParams(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=1.5),
    ("moe", False): _NON_THINKING,
}


def default_sampling(*, moe: bool, thinking: bool) -> SamplingParams:
    """The preset for a dense (27B) or MoE (35B-A3B) model in thinking or non-thinking mode."""
    return SAMPLING_PRESETS[("moe" if moe else "dense", thinking)]


def resolve_sampling(
    request: SamplingParams,
    *,
    preset: SamplingParams,
    server: SamplingParams | None = None,
    greedy: bool = False,
) -> SamplingParams:
    """Merge, later winning: model preset, then server flags, then request fields; `greedy` forces T=0."""
    params = preset if server is None else server.merged_over(preset)
    params = request.merged_over(params)
    return replace(params, temperature=0.0) if greedy else params


def output_token_counts(
    output_token_ids: Sequence[Sequence[int]], vocab_size: int, device: torch.device | str = "cpu"
) -> torch.Tensor:
    """Occurrences of each token in each row's output so far.  # [B, vocab_size] float32"""
    counts = torch.zeros(len(output_token_ids), vocab_size, dtype=torch.float32, device=device)
    for row, ids in enumerate(output_token_ids):
        if ids:
            index = torch.tensor(ids, dtype=torch.long, device=device)
            counts[row].index_add_(0, index, torch.ones(len(ids), device=device))
    return counts


def _column(
    params: Sequence[SamplingParams], name: str, default: float, device: torch.device
) -> torch.Tensor:
    values = [getattr(p, name) for p in params]
    return torch.tensor([default if v is None else v for v in values], dtype=torch.float32, device=device)


def apply_penalties(
    logits: torch.Tensor,  # [B, V] float32, modified in place
    counts: torch.Tensor,  # [B, V] output-token occurrences
    presence: torch.Tensor,  # [B]
    frequency: torch.Tensor,  # [B]
) -> torch.Tensor:
    """OpenAI / vLLM semantics: logit -= presence * [count > 0] + frequency * count."""
    logits -= presence[:, None] * (counts > 0).to(logits.dtype) + frequency[:, None] * counts
    return logits


TOP_K_CANDIDATES = 1024  # rows all with 0 < top_k <= this filter their top-k candidates, not a full sort


def filter_logits(
    logits: torch.Tensor,  # [B, V] float32, already divided by temperature
    top_k: torch.Tensor,  # [B] int64, 0 = off
    top_p: torch.Tensor,  # [B] float32, 1 = off
    min_p: torch.Tensor,  # [B] float32, 0 = off
    max_k: int | None = None,  # largest top_k of the batch (host); 0 or None: some row has none
) -> torch.Tensor:
    """Set the logits that top-k, then top-p, then min-p remove to -inf. The top token always stays.

    Top-p and min-p only ever look at what top-k kept, so when every row has a top-k of at most
    `TOP_K_CANDIDATES` (the model presets use 20) only the `max_k` best logits per row are selected
    (`topk`) instead of sorting the whole vocabulary; the kept set and its logits are the same.
    """
    vocab_size = logits.shape[-1]
    if max_k and max_k <= TOP_K_CANDIDATES and max_k < vocab_size:
        sorted_logits, sorted_idx = logits.topk(max_k, dim=-1)  # sorted, best first
    else:
        sorted_logits, sorted_idx = logits.sort(dim=-1, descending=True)
    ranks = torch.arange(sorted_logits.shape[-1], device=logits.device)
    k = torch.where(top_k <= 0, vocab_size, top_k.clamp(max=vocab_size))
    sorted_logits.masked_fill_(ranks[None, :] >= k[:, None], float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    mass_before = probs.cumsum(dim=-1) - probs  # probability of the better-ranked tokens
    drop = (mass_before >= top_p[:, None]) & (ranks[None, :] > 0)
    sorted_logits.masked_fill_(drop, float("-inf"))
    probs = sorted_logits.softmax(dim=-1)
    drop = (probs < min_p[:, None] * probs[:, :1]) & (ranks[None, :] > 0)
    sorted_logits.masked_fill_(drop, float("-inf"))
    return torch.full_like(logits, float("-inf")).scatter_(1, sorted_idx, sorted_logits)


class Sampler:
    """Batched sampling with one generator per seeded request (kept until `release`)."""

    def __init__(self, device: torch.device | str = "cpu", seed: int | None = None) -> None:
        self.device = torch.device(device)
        self._default = torch.Generator(device=self.device)
        if seed is not None:
            self._default.manual_seed(seed)
        else:
            self._default.seed()
        self._generators: dict[str, torch.Generator] = {}

    def generator(self, request_id: str, seed: int | None) -> torch.Generator:
        """The request's own generator if it has a seed (created on first use), else the shared one."""
        if seed is None:
            return self._default
        gen = self._generators.get(request_id)
        if gen is None:
            gen = torch.Generator(device=self.device)
            gen.manual_seed(seed)
            self._generators[request_id] = gen
        return gen

    def release(self, request_ids: Iterable[str]) -> None:
        for request_id in request_ids:
            self._generators.pop(request_id, None)

    def sample(
        self,
        logits: torch.Tensor,  # [B, V]
        params: Sequence[SamplingParams],
        request_ids: Sequence[str],
        counts: torch.Tensor | None = None,  # [B, V] output-token occurrences, for penalties
    ) -> torch.Tensor:  # [B] int64
        """Next token of each row."""
        assert logits.dim() == 2 and logits.shape[0] == len(params) == len(request_ids), "one row per request"
        dev = logits.device
        greedy_tokens, probs = processed_distribution(logits, params, counts)
        if probs is None:
            return greedy_tokens
        greedy = [p.temperature == 0.0 for p in params]
        noise = torch.empty_like(probs)
        for row, (p, request_id) in enumerate(zip(params, request_ids, strict=True)):
            if not greedy[row]:
                noise[row].exponential_(generator=self.generator(request_id, p.seed))
            else:
                noise[row].fill_(1.0)
        sampled = (probs / noise).argmax(dim=-1)
        return torch.where(torch.tensor(greedy, device=dev), greedy_tokens, sampled)


def processed_distribution(
    logits: torch.Tensor,  # [B, V]
    params: Sequence[SamplingParams],
    counts: torch.Tensor | None = None,  # [B, V] output-token occurrences, for penalties
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The distribution each row samples from, after every warper: (greedy tokens [B] = argmax of the
    penalized logits, probs [B, V] fp32 or None when every row is greedy). A greedy row's probs row is
    the filtered softmax at temperature 1 (unused: greedy rows take the argmax). `Sampler.sample` and
    speculative verification (engine/spec/verify.py) both draw from exactly this."""
    dev = logits.device
    logits = logits.float().clone()
    presence = _column(params, "presence_penalty", 0.0, dev)
    frequency = _column(params, "frequency_penalty", 0.0, dev)
    if counts is not None and bool((presence != 0).any() or (frequency != 0).any()):
        apply_penalties(logits, counts.to(dev, torch.float32), presence, frequency)
    greedy_tokens = logits.argmax(dim=-1)
    greedy = [p.temperature == 0.0 for p in params]
    if all(greedy):
        return greedy_tokens, None
    temperature = _column(params, "temperature", 1.0, dev).masked_fill(torch.tensor(greedy, device=dev), 1.0)
    ks = [p.top_k or 0 for p in params]
    top_k = torch.tensor(ks, dtype=torch.long, device=dev)
    top_p = _column(params, "top_p", 1.0, dev)
    min_p = _column(params, "min_p", 0.0, dev)
    sampled_ks = [k for k, g in zip(ks, greedy, strict=True) if not g]  # greedy rows ignore the filter
    max_k = 0 if min(sampled_ks) <= 0 else max(sampled_ks)
    probs = filter_logits(logits / temperature[:, None], top_k, top_p, min_p, max_k).softmax(dim=-1)
    return greedy_tokens, probs
