"""Requests, their sampling parameters, their terminal reasons and the events streamed up to the API.

Owns: the only per-request state (`Request`), mutated only by the scheduler (STYLE 2.2 rule 2).
Must not touch: pages, lanes, tensors. The runner never sees a `Request`: it gets a `StepPlan` (engine/step.py).

Every request ends in exactly one `FinishEvent` whose `FinishReason.kind` is one of
stop | length | context (finished), aborted, or rejected (with a `RejectCode` and a message).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field, fields, replace
from enum import StrEnum
from typing import TYPE_CHECKING

from engine.structured.spec import StructuredSpec

if TYPE_CHECKING:
    from engine.media.prompt import PromptMedia


def _check(ok: bool, name: str, value: object, rule: str) -> None:
    if not ok:
        raise ValueError(f"{name}={value!r}: {rule}")


MAX_LOGPROBS = 20  # alternatives per step (OpenAI's top_logprobs bound)


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """vLLM's field names. `None` means "not set here": presets, then server flags, then request fields
    are merged by `engine.sampling.resolve_sampling`; a value still None at sampling time takes the
    neutral default (temperature 1, top_p 1, top_k off, min_p 0, penalties 0).

    temperature 0 = greedy. top_k 0 or -1 = off. max_tokens None = the server's default output budget.
    `structured`: the output grammar (engine/structured); None = free text. `logprobs`: None = off; N =
    the sampled token's log-probability and the N most likely alternatives at each step (0..20).
    `thinking_budget` (ours): reasoning tokens after which the engine closes the reasoning itself (it forces
    the chat template's `\n</think>\n\n` in place of the next token); -1 = no budget, None = not set.
    """

    max_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False
    thinking_budget: int | None = None
    structured: StructuredSpec | None = None
    logprobs: int | None = None

    def __post_init__(self) -> None:
        # Accept the vLLM spellings `stop="x"` and lists, store tuples (hashable, immutable).
        if isinstance(self.stop, str):
            object.__setattr__(self, "stop", (self.stop,))
        else:
            object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "stop_token_ids", tuple(self.stop_token_ids))
        mt = self.max_tokens
        _check(mt is None or (_int(mt) and mt >= 1), "max_tokens", mt, "must be >= 1")
        _check(_opt_range(self.temperature, 0.0, 2.0), "temperature", self.temperature, "must be in [0, 2]")
        tp = self.top_p
        _check(tp is None or (_num(tp) and 0.0 < tp <= 1.0), "top_p", tp, "must be in (0, 1]")
        tk = self.top_k
        _check(
            tk is None or (_int(tk) and -1 <= tk < 2**31), "top_k", tk, "must be -1, 0 (off) or in 1..2**31-1"
        )
        _check(_opt_range(self.min_p, 0.0, 1.0), "min_p", self.min_p, "must be in [0, 1]")
        for name in ("presence_penalty", "frequency_penalty"):
            value = getattr(self, name)
            _check(_opt_range(value, -2.0, 2.0), name, value, "must be in [-2, 2]")
        seed = self.seed  # torch.Generator.manual_seed's range; beyond it the engine loop would raise
        _check(
            seed is None or (_int(seed) and -(2**63) <= seed < 2**64), "seed", seed, "must be a 64-bit int"
        )
        _check(all(isinstance(s, str) and s for s in self.stop), "stop", self.stop, "non-empty strings")
        ids = self.stop_token_ids
        _check(all(_int(t) and t >= 0 for t in ids), "stop_token_ids", ids, "must be token ids >= 0")
        _check(isinstance(self.ignore_eos, bool), "ignore_eos", self.ignore_eos, "must be a bool")
        tb = self.thinking_budget
        _check(tb is None or (_int(tb) and tb >= -1), "thinking_budget", tb, "must be -1 (none) or >= 0")
        lp = self.logprobs
        _check(
            lp is None or (_int(lp) and 0 <= lp <= MAX_LOGPROBS),
            "logprobs",
            lp,
            f"must be in [0, {MAX_LOGPROBS}]",
        )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def merged_over(self, base: SamplingParams) -> SamplingParams:
        """Fields set here win; unset (None / empty) fields fall back to `base`."""
        values = {}
        for f in fields(self):
            mine = getattr(self, f.name)
            values[f.name] = getattr(base, f.name) if mine is None or mine == () else mine
        values["ignore_eos"] = self.ignore_eos or base.ignore_eos
        return replace(self, **values)


def _int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _num(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def _opt_range(value: object, lo: float, hi: float) -> bool:
    return value is None or (_num(value) and lo <= value <= hi)  # type: ignore[operator]


class RequestStatus(StrEnum):
    WAITING = "waiting"  # queued, holds nothing
    RUNNING = "running"  # holds a lane, pages and a state slot
    FINISHED = "finished"  # terminal; `finish_reason` says how (including aborted / rejected)


class FinishKind(StrEnum):
    STOP = "stop"  # EOS, a stop token id or a stop string
    LENGTH = "length"  # max_tokens reached
    CONTEXT = "context"  # max_context reached before max_tokens
    ABORTED = "aborted"  # cancelled by the client / server
    REJECTED = "rejected"  # refused before admission (HTTP 4xx/5xx with a reason)


class RejectCode(StrEnum):
    OVERLOADED = "server_overloaded"  # pending queue full (429)
    QUEUE_TIMEOUT = "request_queue_timeout"  # waited past --pending-timeout-ms (503)
    CONTEXT_LENGTH = "context_length_exceeded"  # prompt leaves no room for output (400)
    TOO_LARGE = "request_too_large"  # could never fit in the KV pool even alone (400)


@dataclass(frozen=True, slots=True)
class FinishReason:
    kind: FinishKind
    code: RejectCode | None = None  # only for REJECTED
    message: str = ""
    stop_match: int | str | None = None  # the stop token id or stop string that ended a STOP

    @classmethod
    def stop(cls, match: int | str | None = None) -> FinishReason:
        return cls(FinishKind.STOP, stop_match=match)

    @classmethod
    def length(cls) -> FinishReason:
        return cls(FinishKind.LENGTH)

    @classmethod
    def context(cls) -> FinishReason:
        return cls(FinishKind.CONTEXT)

    @classmethod
    def aborted(cls, message: str = "") -> FinishReason:
        return cls(FinishKind.ABORTED, message=message)

    @classmethod
    def rejected(cls, code: RejectCode, message: str) -> FinishReason:
        return cls(FinishKind.REJECTED, code=code, message=message)

    def __str__(self) -> str:
        return (
            self.kind.value if self.code is None else f"{self.kind.value}({self.code.value}: {self.message})"
        )


@dataclass(frozen=True, slots=True)
class ReasoningTokens:
    """The tokenizer's reasoning markers, as the scheduler needs them to enforce a thinking budget."""

    start_id: int  # `<think>`
    end_id: int  # `</think>`
    close_ids: tuple[int, ...]  # the chat template's `\n</think>\n\n`, forced when a budget is spent


@dataclass(slots=True, eq=False)
class Request:
    """One generation request. `token_ids` is prompt + output; the scheduler feeds
    `token_ids[num_computed_tokens:]` to the model, so prefill, chunked prefill, prefix hits and
    decode are only different values of `num_computed_tokens` (STYLE 2.9.1).

    `checkpoint_positions`: token positions (1..num_prompt_tokens) where the chat template marks a
    message boundary (assistant turn end, tool result end, the generation opener); the scheduler may
    save a GDN state checkpoint there so later requests can branch from it.

    `media`: the prompt's images / videos (engine/media/prompt.py), None for a text prompt. Its placeholder
    tokens are identified by their media's SHA-256 for prefix reuse (`identity_ids`), and no checkpoint
    position falls inside a placeholder run (such positions are dropped).
    """

    request_id: str
    prompt_token_ids: list[int]
    sampling_params: SamplingParams = field(default_factory=SamplingParams)
    arrival_time: float = field(default_factory=time.monotonic)
    checkpoint_positions: tuple[int, ...] = ()
    media: PromptMedia | None = None
    status: RequestStatus = field(default=RequestStatus.WAITING, init=False)
    token_ids: list[int] = field(init=False)
    num_prompt_tokens: int = field(init=False)
    num_computed_tokens: int = field(default=0, init=False)
    num_cached_tokens: int = field(default=0, init=False)  # tokens reused from a prefix checkpoint
    num_host_cached_tokens: int = field(default=0, init=False)  # ... of which restored from host RAM
    admitted_time: float | None = field(default=None, init=False)  # scheduler clock when given a lane
    first_token_time: float | None = field(default=None, init=False)  # ... when its first token was sampled
    finish_reason: FinishReason | None = field(default=None, init=False)
    # Inside the reasoning (the prompt opened `<think>`, or the output did, and no `</think>` came yet) and
    # how many reasoning tokens were generated: the thinking budget's count (Scheduler.commit).
    in_reasoning: bool = field(default=False, init=False)
    num_reasoning_tokens: int = field(default=0, init=False)
    # Chained page hashes of token_ids' full pages, extended lazily (engine.cache.prefix).
    page_hashes: list[bytes] = field(default_factory=list, init=False)

    def __post_init__(self) -> None:
        ids = self.prompt_token_ids
        _check(len(ids) >= 1, "prompt_token_ids", f"<{len(ids)} tokens>", "must hold at least one token")
        _check(all(_int(t) and t >= 0 for t in ids), "prompt_token_ids", "<ids>", "must be token ids >= 0")
        self.token_ids = list(ids)
        self.num_prompt_tokens = len(ids)
        positions = tuple(sorted(set(self.checkpoint_positions)))
        _check(
            all(_int(p) and 1 <= p <= self.num_prompt_tokens for p in positions),
            "checkpoint_positions",
            positions,
            f"must be positions in 1..{self.num_prompt_tokens}",
        )
        if self.media is not None:
            _check(
                self.media.num_prompt_tokens == len(ids),
                "media",
                f"<{self.media.num_prompt_tokens} tokens>",
                f"must describe the {len(ids)} prompt tokens",
            )
            positions = tuple(p for p in positions if not self.media.splits(p))
        self.checkpoint_positions = positions

    @property
    def identity_ids(self) -> list[int]:
        """The ids the prefix index hashes: `token_ids`, with the prompt's media placeholders replaced by ids
        derived from each medium's SHA-256 (engine/media/prompt.py)."""
        if self.media is None:
            return self.token_ids
        return [*self.media.identity_ids, *self.token_ids[self.num_prompt_tokens :]]

    def splits_media(self, position: int) -> bool:
        """Whether a prefix of `position` tokens would end inside an image's (or a frame's) placeholder run."""
        return self.media is not None and self.media.splits(position)

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_output_tokens(self) -> int:
        return len(self.token_ids) - self.num_prompt_tokens

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens :]

    @property
    def is_finished(self) -> bool:
        return self.status is RequestStatus.FINISHED


@dataclass(frozen=True, slots=True)
class TokenLogprob:
    """A sampled token's log-probability under the model (the raw logits' log-softmax, before penalties,
    grammar masks and temperature) and the `SamplingParams.logprobs` most likely tokens, best first."""

    token_id: int
    logprob: float
    top: tuple[tuple[int, float], ...] = ()


@dataclass(frozen=True, slots=True)
class TokenEvent:
    """New tokens of one request from one step (more than one once speculative decoding lands)."""

    request_id: str
    token_ids: tuple[int, ...]
    num_output_tokens: int  # after these tokens
    logprobs: tuple[TokenLogprob, ...] | None = None  # one per token when the request asked for them


@dataclass(frozen=True, slots=True)
class SpecRequestStats:
    """One request's speculative decoding (`--spec`): verify rounds, drafts fed and accepted, decode steps
    whose drafts were dropped near the length limit, and per draft position the rounds that accepted it."""

    backend: str
    draft_window: int  # K
    rounds: int
    drafted_tokens: int
    accepted_tokens: int
    fallback_steps: int
    accepted_per_position: tuple[int, ...]

    @property
    def acceptance(self) -> float:
        return self.accepted_tokens / self.drafted_tokens if self.drafted_tokens else 0.0

    @property
    def tokens_per_round(self) -> float:
        return 1.0 + self.accepted_tokens / self.rounds if self.rounds else 1.0


@dataclass(frozen=True, slots=True)
class FinishEvent:
    """The one terminal event of a request. `queue_seconds`: arrival to admission (to the end if never
    admitted); `prefill_seconds`: admission to the first sampled token (None if none was sampled)."""

    request_id: str
    reason: FinishReason
    num_prompt_tokens: int
    num_output_tokens: int
    num_cached_tokens: int
    queue_seconds: float | None = None
    prefill_seconds: float | None = None
    num_host_cached_tokens: int = 0  # of num_cached_tokens, restored from host RAM (host parking)
    speculative: SpecRequestStats | None = None  # None without --spec


Event = TokenEvent | FinishEvent
