"""Per-request grammar state and the batch's token bitmask, computed off the decode critical path.

Owns: one `RowGrammar` per constrained request (its llguidance matcher and phase, see
engine/structured/spec.py), keyed by request id like the sampler's other per-request state and dropped
by `release`; the pinned host bitmask buffers and the worker thread that fills them.
Must not touch: logits (engine/sampling.py applies the mask), requests, the scheduler.

Bitmask layout (llguidance's): row r, word w, bit b allows token 32 * w + b; [B, ceil(V / 32)] int32.
A row inside a span gets its matcher's mask; a row whose spans are used up (or whose matcher failed) gets
only the end-of-turn tokens; a free row (reasoning, text between tool calls, no grammar) gets all ones, so
one fused op masks the whole batch. A step where no row is constrained gets no mask at all, so
unconstrained decoding pays nothing.

Overlap (`overlap=True`, the default): `commit(ids, tokens)` hands the sampled tokens to one worker thread
and returns at once; the worker advances the matchers and computes every committed row's next mask into a
pinned host buffer (llguidance releases the GIL while it computes masks, on its own thread pool) while the
caller plans and launches the next forward. `bitmask` waits for the worker, takes the precomputed rows
(the buffer as is when the step's rows are the committed ones in order, the common decode step), computes
only the rows it lacks (a request's first step, a row after forced tokens), and sends the batch to the
device in one non-blocking copy. Two pinned buffers alternate, each reused only after its previous copy
finished (a CUDA event), so a copy in flight is never overwritten. `overlap=False` does all of it inside
`commit` and `bitmask` (the synchronous reference: both give the same masks, so the same tokens).
Every read or change of a matcher outside the worker first waits for it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
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

    @property
    def constrained(self) -> bool:
        return self.active or self.done


@dataclass(slots=True)
class _Staged:
    """What the worker computed after a commit: masks of `request_ids` (in order) in ring buffer `buffer`."""

    request_ids: tuple[str, ...]
    buffer: int
    known: frozenset[str]  # the ids that had a grammar then (any other row was staged as free)


class GrammarRows:
    """Use: `bitmask(specs, ids)` before sampling a step, `commit(ids, tokens)` after, `release(ids)` at the end."""

    def __init__(self, compiler: GrammarCompiler, device: torch.device, overlap: bool = True) -> None:
        self.compiler = compiler
        self.device = device
        self.overlap = overlap  # compute the next step's masks in the worker (see the module doc)
        self.words = -(-compiler.vocab_size // 32)
        self._rows: dict[str, RowGrammar] = {}
        self._ring = [self._buffer(8), self._buffer(8)]  # pinned on CUDA; alternate between steps
        self._copied: list[torch.cuda.Event | None] = [None, None]  # each buffer's last copy to the device
        self._next = 0
        self._eos_row = torch.zeros(self.words, dtype=torch.int32)
        for token in compiler.eos_token_ids:
            if token < compiler.vocab_size:
                word, bit = divmod(token, 32)
                value = int(self._eos_row[word]) | (1 << bit)
                self._eos_row[word] = value - (1 << 32) if value >= 1 << 31 else value
        self._executor: llguidance.LLExecutor | None = None
        self._worker: ThreadPoolExecutor | None = None
        self._pending: Future[_Staged | None] | None = None
        self._staged: _Staged | None = None
        self.num_precomputed = 0  # mask rows the worker computed ahead (observability, tests)
        self.num_computed_inline = 0  # mask rows `bitmask` computed itself

    def _buffer(self, rows: int) -> torch.Tensor:
        pin = self.device.type == "cuda"
        return torch.empty(rows, self.words, dtype=torch.int32, pin_memory=pin)

    def _take_buffer(self, rows: int) -> int:
        """The next ring buffer, with room for `rows` rows, once its previous copy to the device is done."""
        index = self._next
        self._next = 1 - index
        event = self._copied[index]
        if event is not None:
            event.synchronize()
            self._copied[index] = None
        if self._ring[index].shape[0] < rows:
            self._ring[index] = self._buffer(max(rows, 2 * self._ring[index].shape[0]))
        return index

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

    def _wait(self) -> None:
        """Let the worker finish what it was handed (its errors surface here)."""
        pending, self._pending = self._pending, None
        if pending is not None:
            self._staged = pending.result()

    def bitmask(
        self, specs: Sequence[StructuredSpec | None], request_ids: Sequence[str]
    ) -> tuple[list[int], torch.Tensor] | None:
        """(every row index of the step, the [B, words] int32 bitmask on the device: all ones for free rows);
        None when no row of this step is constrained (free rows need no mask)."""
        self._wait()
        states = [None if s is None else self.row(i, s) for s, i in zip(specs, request_ids, strict=True)]
        if not any(state is not None and state.constrained for state in states):
            return None
        staged, self._staged = self._staged, None
        fresh = [i for i, state in zip(request_ids, states, strict=True) if state is not None]
        if staged is not None and staged.request_ids == tuple(request_ids) and staged.known.issuperset(fresh):
            # the decode step's rows in the committed order: the worker filled them all
            index = staged.buffer
            self.num_precomputed += sum(1 for state in states if state is not None and state.active)
        else:
            index = self._take_buffer(len(states))
            host = self._ring[index]
            done: dict[str, int] = {}
            if staged is not None:
                done = {i: slot for slot, i in enumerate(staged.request_ids) if i in staged.known}
            busy: list[tuple[llguidance.LLMatcher, int]] = []
            for slot, (state, request_id) in enumerate(zip(states, request_ids, strict=True)):
                found = done.get(request_id)
                if found is not None and state is not None:
                    host[slot].copy_(self._ring[staged.buffer][found])  # type: ignore[union-attr]
                    self.num_precomputed += int(state.active)
                elif not self._fixed_row(host[slot], state):
                    assert state is not None
                    busy.append((state.matcher, slot))
            self.num_computed_inline += len(busy)
            if busy:
                self._fill(busy, host)
        return list(range(len(states))), self._to_device(index, len(states))

    def _fixed_row(self, out: torch.Tensor, state: RowGrammar | None) -> bool:
        """Fill `out` for a row whose mask needs no matcher (free: all ones; done: the end of turn)."""
        if state is None or not state.constrained:
            out.fill_(-1)
        elif state.done:
            out.copy_(self._eos_row)
        else:
            return False
        return True

    def _to_device(self, index: int, rows: int) -> torch.Tensor:
        host = self._ring[index][:rows]
        if self.device.type == "cpu":
            return host.clone()
        bits = host.to(self.device, non_blocking=True)
        if self.device.type == "cuda":
            event = torch.cuda.Event()
            event.record()
            self._copied[index] = event
        return bits

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
        """Advance each constrained row past its sampled token (in the worker under `overlap`, which then
        computes the rows' next masks; this returns at once)."""
        self._wait()
        self._staged = None
        pairs = [(i, t, self._rows.get(i)) for i, t in zip(request_ids, token_ids, strict=True)]
        if not self.overlap:
            self._advance_all(pairs)
            return
        if not any(state is not None for _, _, state in pairs):
            return
        index = self._take_buffer(len(pairs))
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="ninfer-grammar")
        self._pending = self._worker.submit(self._advance_and_stage, pairs, index)

    def _advance_all(self, pairs: Sequence[tuple[str, int, RowGrammar | None]]) -> None:
        for request_id, token, state in pairs:
            if state is not None and not state.failed:
                self._advance(request_id, state, token)

    def _advance_and_stage(self, pairs: Sequence[tuple[str, int, RowGrammar | None]], index: int) -> _Staged:
        """The worker's job: advance the matchers, then compute each committed row's next mask (once per
        request: forced tokens commit one request several times) into ring buffer `index`."""
        self._advance_all(pairs)
        rows = {request_id: state for request_id, _, state in pairs}
        host = self._ring[index]
        busy = [(state.matcher, slot) for slot, state in enumerate(rows.values())
                if not self._fixed_row(host[slot], state) and state is not None]  # fmt: skip
        if busy:
            self._fill(busy, host)
        known = frozenset(request_id for request_id, state in rows.items() if state is not None)
        return _Staged(tuple(rows), index, known)

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
        """Forget requests that ended (the worker may still hold their states: it only writes their masks)."""
        for request_id in request_ids:
            self._rows.pop(request_id, None)

    def settle(self) -> None:
        """Wait for the worker: afterwards the matchers may be read (tests, benches)."""
        self._wait()

    def __len__(self) -> int:
        return len(self._rows)
