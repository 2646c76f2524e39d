"""Sampler: logits -> next token ids, batched over rows with per-row parameters; sampling presets.

Owns: the sampling math (penalties, temperature, top-k, top-p, min-p, greedy) and the per-request
seeded generators. Must not touch requests or the scheduler: the runner passes logits, each row's
`SamplingParams` and request id, and (for penalties) each row's output-token counts.

Order of the warpers follows HF transformers (the reference oracle): penalties on the raw logits,
then temperature, top-k, top-p, min-p. temperature 0 is greedy: argmax of the penalized logits.
A structured-output row's grammar bitmask sets the logits of the tokens it forbids to -inf right after
the penalties (one fused launch for the whole batch, kernels/bitmask.py), so greedy and sampled rows alike
pick an allowed token. The masks are computed on the host by engine/structured/matchers.py, in a worker
thread that starts as soon as `commit` hands it the sampled tokens and runs while the next forward does;
`sample` only waits for them (it leaves the CUDA-graph replay untouched: it applies to the graph's logits).
Sampling uses the exponential race (argmax of probs / Exp(1) noise), drawn per row from that row's
generator: a request with a `seed` owns a generator seeded once, so its tokens depend only on its own
logits and seed, never on which other requests share the batch.
Nothing here waits for the device: the per-row columns built from Python lists go up through
engine/transfer.py `upload` (pinned, non-blocking on CUDA), and whether a batch has penalties is decided from
its `SamplingParams` on the host, so an overlapped step (engine/core.py) can sample sampled and penalized rows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import replace

import torch

from engine.request import SamplingParams, TokenLogprob
from engine.structured.compiler import GrammarCompiler
from engine.structured.matchers import GrammarRows
from engine.transfer import upload
from kernels.bitmask import apply_token_bitmask_

# Default sampling by model family and thinking mode (issue 4; Qwen's model cards).
_NON_THINKING = SamplingParams(temperature=0.7, top_p=0.8, top_k=20, min_p=0.0, presence_penalty=1.5)
SAMPLING_PRESETS: dict[tuple[str, bool], SamplingParams] = {
    ("dense", True): SamplingParams(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=0.0),
    ("dense", False): _NON_THINKING,
    ("moe", True): SamplingParams(temperature=1.0, top_p=0.95, top_k=20, min_p=0.0, presence_penalty=1.5),
    ("moe", False): _NON_THINKING,
}


# Reasoning-effort tiers (OpenAI `reasoning_effort` / Responses `reasoning.effort` / `--reasoning-effort`) ->
# thinking budgets: reasoning tokens before the engine closes the reasoning itself (README "Thinking"). `none`
# turns thinking off; `max` sets no budget (-1). The tiers grow about 4x per step up to Qwen's recommended
# 32,768-token output for hard problems.
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")
EFFORT_THINKING_BUDGETS: dict[str, int] = {
    "minimal": 512,
    "low": 2048,
    "medium": 8192,
    "high": 16384,
    "xhigh": 32768,
    "max": -1,
}


def effort_thinking(effort: str) -> tuple[bool, int | None]:
    """(thinking on, thinking budget) of a reasoning-effort tier; ValueError for an unknown tier."""
    if effort not in REASONING_EFFORTS:
        raise ValueError(f"reasoning effort {effort!r}: must be one of {', '.join(REASONING_EFFORTS)}")
    return effort != "none", EFFORT_THINKING_BUDGETS.get(effort)


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
    device = torch.device(device)
    counts = torch.zeros(len(output_token_ids), vocab_size, dtype=torch.float32, device=device)
    rows = [row for row, ids in enumerate(output_token_ids) for _ in ids]
    if rows:  # one copy, no wait
        index = upload([rows, [t for ids in output_token_ids for t in ids]], device)
        counts.index_put_((index[0], index[1]), torch.ones(len(rows), device=device), accumulate=True)
    return counts


def penalized(params: Sequence[SamplingParams]) -> bool:
    """Some row has a presence or frequency penalty."""
    return any(p.presence_penalty or p.frequency_penalty for p in params)


def _column(
    params: Sequence[SamplingParams], name: str, default: float, device: torch.device
) -> torch.Tensor:
    values = [getattr(p, name) for p in params]
    return upload([default if v is None else v for v in values], device, torch.float32)


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


def token_logprobs(
    logits: torch.Tensor,  # [B, V] the raw logits
    token_ids: Sequence[int],  # [B] the sampled tokens
    num_top: Sequence[int | None],  # [B] alternatives wanted per row; None: the row wants none
) -> list[TokenLogprob | None]:
    """Each row's sampled-token log-probability and its `num_top` best tokens (one host copy)."""
    want = [i for i, n in enumerate(num_top) if n is not None]
    out: list[TokenLogprob | None] = [None] * len(num_top)
    if not want:
        return out
    index = upload(want, logits.device)
    lp = logits[index].float().log_softmax(dim=-1)
    chosen = lp.gather(1, upload([[token_ids[i]] for i in want], logits.device))[:, 0]
    k = max(int(num_top[i] or 0) for i in want)
    top_v, top_i = lp.topk(k, dim=-1) if k else (lp[:, :0], lp[:, :0].long())
    chosen_h, top_vh, top_ih = chosen.tolist(), top_v.tolist(), top_i.tolist()
    for j, row in enumerate(want):
        n = int(num_top[row] or 0)
        top = tuple(zip(top_ih[j][:n], top_vh[j][:n], strict=True))
        out[row] = TokenLogprob(token_ids[row], chosen_h[j], top)
    return out


class Sampler:
    """Batched sampling with one generator per seeded request (kept until `release`)."""

    def __init__(
        self,
        device: torch.device | str = "cpu",
        seed: int | None = None,
        grammars: GrammarCompiler | None = None,
    ) -> None:
        """grammars: compiles `SamplingParams.structured`; None = structured outputs are not served."""
        self.device = torch.device(device)
        self.grammars = None if grammars is None else GrammarRows(grammars, self.device)
        if (
            grammars is not None and self.device.type == "cuda"
        ):  # compile the mask kernel now, not on a request
            words = -(-grammars.vocab_size // 32)
            logits = torch.zeros(1, grammars.vocab_size, device=self.device)
            apply_token_bitmask_(logits, torch.full((1, words), -1, dtype=torch.int32, device=self.device))
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
        ids = list(request_ids)
        for request_id in ids:
            self._generators.pop(request_id, None)
        if self.grammars is not None:
            self.grammars.release(ids)

    @staticmethod
    def constrains(params: Sequence[SamplingParams]) -> bool:
        """Some row has an output grammar (the runner's greedy fast path must not skip `sample`)."""
        return any(p.structured is not None for p in params)

    def commit(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> None:
        """The tokens `sample` chose, on the host: advance the rows' grammar matchers past them."""
        if self.grammars is not None:
            self.grammars.commit(request_ids, token_ids)

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
        mask = None
        if self.constrains(params):  # host work first: it overlaps the forward still running
            if self.grammars is None:
                raise ValueError("structured outputs need a Sampler built with a GrammarCompiler")
            mask = self.grammars.bitmask([p.structured for p in params], request_ids)  # (rows, [R, W])
        greedy_tokens, probs = processed_distribution(logits, params, counts, mask)
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
        return torch.where(upload(greedy, dev, torch.bool), greedy_tokens, sampled)


def processed_distribution(
    logits: torch.Tensor,  # [B, V]
    params: Sequence[SamplingParams],
    counts: torch.Tensor | None = None,  # [B, V] output-token occurrences, for penalties
    mask: tuple[Sequence[int], torch.Tensor] | None = None,  # (constrained rows, their packed token bitmask)
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The distribution each row samples from, after every warper: (greedy tokens [B] = argmax of the
    penalized (and grammar-masked) logits, probs [B, V] fp32 or None when every row is greedy). A greedy
    row's probs row is the filtered softmax at temperature 1 (unused: greedy rows take the argmax).
    `Sampler.sample` and speculative verification (engine/spec/verify.py) both draw from exactly this."""
    dev = logits.device
    logits = logits.float().clone()
    if counts is not None and penalized(params):  # decided on the host: no sync
        presence = _column(params, "presence_penalty", 0.0, dev)
        frequency = _column(params, "frequency_penalty", 0.0, dev)
        apply_penalties(logits, counts.to(dev, torch.float32), presence, frequency)
    if mask is not None:
        rows, bits = mask
        if len(rows) == logits.shape[0]:
            apply_token_bitmask_(logits, bits)
        else:  # only the constrained rows pay for the unpacking
            index = upload(list(rows), dev)
            logits[index] = apply_token_bitmask_(logits[index], bits)
    greedy_tokens = logits.argmax(dim=-1)
    greedy = [p.temperature == 0.0 for p in params]
    if all(greedy):
        return greedy_tokens, None
    temperature = _column(params, "temperature", 1.0, dev).masked_fill(upload(greedy, dev, torch.bool), 1.0)
    ks = [p.top_k or 0 for p in params]
    top_k = upload(ks, dev)
    top_p = _column(params, "top_p", 1.0, dev)
    min_p = _column(params, "min_p", 0.0, dev)
    sampled_ks = [k for k, g in zip(ks, greedy, strict=True) if not g]  # greedy rows ignore the filter
    max_k = 0 if min(sampled_ks) <= 0 else max(sampled_ks)
    probs = filter_logits(logits / temperature[:, None], top_k, top_p, min_p, max_k).softmax(dim=-1)
    return greedy_tokens, probs
