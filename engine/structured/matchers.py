"""Per-request grammar state and the batch's token bitmask.

Owns: one `RowGrammar` per constrained request (its llguidance matcher and phase, see
engine/structured/spec.py), keyed by request id like the sampler's other per-request state and dropped
by `release`; and the host bitmask buffer, filled for all constrained rows at once by llguidance's
thread pool, then copied to the device in one transfer.
Must not touch: logits (engine/sampling.py applies the mask), requests, the scheduler.

Bitmask layout (llguidance's): row r, word w, bit b allows token 32 * w + b; [B, ceil(V / 32)] int32.
Only rows inside a span, or whose spans are used up (or whose matcher failed: only the end-of-turn
tokens), get a mask row; a row that is free this step (reasoning, text between tool calls) gets none,
and a step where no row is constrained returns no mask at all, so unconstrained decoding pays nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from engine.structured.compiler import GrammarCompiler
from engine.structured.spec import StructuredSpec

if TYPE_CHECKING:
    import llguidance

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class RowGrammar:
    spec: StructuredSpec
    matcher: llguidance.LLMatcher
    trigger_id: int | None
    reasoning: bool  # inside `<think>`: free until `</think>`
    active: bool  # inside a constrained span
    spans: int = 0  # spans completed
    failed: bool = False

    @property
    def done(self) -> bool:
        """Only the end of the turn may follow."""
        limit = self.spec.max_spans
        return self.failed or (self.trigger_id is not None and limit is not None and self.spans >= limit)


class GrammarRows:
    """Use: `bitmask(specs, ids)` before sampling a step, `commit(ids, tokens)` after, `release(ids)` at the end."""

    def __init__(self, compiler: GrammarCompiler, device: torch.device) -> None:
        self.compiler = compiler
        self.device = device
        self.words = -(-compiler.vocab_size // 32)
        self._rows: dict[str, RowGrammar] = {}
        self._host = self._buffer(8)
        self._eos_row = torch.zeros(self.words, dtype=torch.int32)
        for token in compiler.eos_token_ids:
            if token < compiler.vocab_size:
                word, bit = divmod(token, 32)
                value = int(self._eos_row[word]) | (1 << bit)
                self._eos_row[word] = value - (1 << 32) if value >= 1 << 31 else value
        self._executor: llguidance.LLExecutor | None = None

    def _buffer(self, rows: int) -> torch.Tensor:
        pin = self.device.type == "cuda"
        return torch.empty(rows, self.words, dtype=torch.int32, pin_memory=pin)

    def row(self, request_id: str, spec: StructuredSpec) -> RowGrammar:
        state = self._rows.get(request_id)
        if state is None:
            compiler = self.compiler
            trigger = None if spec.trigger is None else compiler.token_id(spec.trigger)
            reasoning = spec.in_reasoning and compiler.think_end_id is not None
            active = not reasoning and trigger is None
            state = RowGrammar(spec, compiler.matcher(spec), trigger, reasoning, active)
            self._rows[request_id] = state
        return state

    def bitmask(
        self, specs: Sequence[StructuredSpec | None], request_ids: Sequence[str]
    ) -> tuple[list[int], torch.Tensor] | None:
        """(constrained row indices, their [R, words] int32 bitmask on the device); None when no row of
        this step is constrained (free rows need no mask)."""
        states = [None if s is None else self.row(i, s) for s, i in zip(specs, request_ids, strict=True)]
        rows = [i for i, r in enumerate(states) if r is not None and (r.active or r.done)]
        if not rows:
            return None
        if self._host.shape[0] < len(rows):
            self._host = self._buffer(len(rows))
        host = self._host[: len(rows)]
        busy: list[tuple[llguidance.LLMatcher, int]] = []
        for slot, index in enumerate(rows):
            state = states[index]
            assert state is not None
            if state.done:
                host[slot].copy_(self._eos_row)
            else:
                busy.append((state.matcher, slot))
        if busy:
            self._fill(busy, host)
        bits = host.to(self.device, non_blocking=True) if self.device.type != "cpu" else host.clone()
        return rows, bits

    def _fill(self, busy: list[tuple[llguidance.LLMatcher, int]], host: torch.Tensor) -> None:
        if len(busy) == 1:
            matcher, index = busy[0]
            view = host[index]
            matcher.unsafe_compute_mask_ptr(view.data_ptr(), view.numel() * 4)
            return
        if self._executor is None:
            import llguidance

            self._executor = llguidance.LLExecutor()
        self._executor.unsafe_compute_mask_ptr(busy, host.data_ptr(), self.words * 4, host.shape[0])

    def commit(self, request_ids: Sequence[str], token_ids: Sequence[int]) -> None:
        """Advance each constrained row past its sampled token."""
        for request_id, token in zip(request_ids, token_ids, strict=True):
            state = self._rows.get(request_id)
            if state is not None and not state.failed:
                self._advance(request_id, state, token)

    def _advance(self, request_id: str, state: RowGrammar, token: int) -> None:
        if state.reasoning:
            if token == self.compiler.think_end_id:
                state.reasoning = False
                state.active = state.trigger_id is None
            return
        if not state.active:
            if token == state.trigger_id and not state.done:
                state.matcher.reset()
                state.active = True
            return
        if not state.matcher.consume_token(token):
            if token not in self.compiler.eos_token_ids:
                logger.warning("request %s: token %d left its grammar: %s", request_id, token,
                               state.matcher.get_error().splitlines()[:1])  # fmt: skip
            state.failed, state.active = True, False
            return
        if state.trigger_id is not None and state.matcher.is_stopped():
            state.spans += 1
            state.active = False

    def release(self, request_ids: Sequence[str]) -> None:
        for request_id in request_ids:
            self._rows.pop(request_id, None)

    def __len__(self) -> int:
        return len(self._rows)
