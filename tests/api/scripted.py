"""A scripted engine: the `AsyncEngine` interface, replaying fixed continuations through the real tokenizer.

Random tiny weights never emit a tool call, so protocol tests that need reasoning, tool calls, malformed
calls or stop strings serve this engine behind the real app, parsers and SDKs. The continuation is chosen
by a `[[name]]` marker in the last user query; a turn of tool results gets the `after_tool` answer.
Prefix caching is imitated: a prompt reports as cached the largest checkpoint position it shares with an
earlier prompt; so is the engine's thinking budget (`SamplingParams.thinking_budget`).
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass

from engine.chat.parse import prompt_ends_in_reasoning
from engine.config import EngineConfig
from engine.core import THINK_CLOSE
from engine.request import Event, FinishEvent, FinishReason, RejectCode, SamplingParams, TokenEvent
from engine.tokenizer import Tokenizer

TOOL_CALL = (
    "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
    "<parameter=days>\n3\n</parameter>\n</function>\n</tool_call>"
)
# name -> (reasoning, content, seconds per token)
SCRIPTS: dict[str, tuple[str, str, float]] = {
    "plain": ("The user greets me.", "Hello! I am a scripted model.", 0.0),
    "tool": ("I should call the weather tool.", "Let me check.\n\n" + TOOL_CALL, 0.0),
    "malformed": (
        "Calling something.",
        "<tool_call>\n<function=launch_rockets>\n</function>\n</tool_call>",
        0.0,
    ),
    "stop": ("Counting.", "one two STOP three four", 0.0),
    "cut": (  # a call whose string value spans tokens, for cutting it with max_tokens
        "I should call the weather tool.",
        "Let me check.\n\n" + TOOL_CALL.replace("Paris", "San Francisco"),
        0.0,
    ),
    "after_tool": ("The tool answered.", "It will be sunny in Paris.", 0.0),
    "long": ("Thinking for a long while. " * 10, "word " * 200, 0.005),
    "pause": ("", "", 0.0),
    "drifted": (  # tool-call markup a tolerant server recovers (wrapper, dropped <, <<, no </function>)
        "Weather needed.",
        "Checking.\n\n<toolcall>\n<function=get_weather>\nparameter=city>\nParis\n</parameter>\n"
        "<<parameter=days>\n3\n</parameter>\n</toolcall>",
        0.0,
    ),
    "overthink": (
        "Step. " * 700,
        "Final answer.",
        0.0,
    ),  # ~1400 reasoning tokens  # special-cased: one token, a pause, then the rest
}
_MARKER = re.compile(r"\[\[(\w+)\]\]")


@dataclass
class ScriptedStats:
    num_running: int = 0
    num_waiting: int = 0
    num_requests_added: int = 0
    num_aborted: int = 0


class ScriptedEngine:
    def __init__(self, tokenizer: Tokenizer, model_id: str, config: EngineConfig) -> None:
        self.tokenizer = tokenizer
        self.model_id = model_id
        self.config = config
        self.error: BaseException | None = None
        self._aborted: set[str] = set()
        self._prompts: list[tuple[list[int], tuple[int, ...]]] = []
        self._stats = ScriptedStats()

    def start(self) -> None:
        pass

    def shutdown(self, drain: bool = True) -> None:
        pass

    def abort(self, request_id: str) -> None:
        self._aborted.add(request_id)

    def stats(self) -> ScriptedStats:
        return self._stats

    def _cached(self, ids: list[int], positions: tuple[int, ...]) -> int:
        best = 0
        for old, _ in self._prompts:
            common = next(
                (i for i, (a, b) in enumerate(zip(old, ids, strict=False)) if a != b), min(len(old), len(ids))
            )
            best = max([best, *(p for p in positions if p <= common and p < len(ids))])
        return best

    def _script(self, prompt: str) -> tuple[str, str, float, str]:
        turn = prompt[prompt.rfind("<|im_start|>user") :]
        match = _MARKER.search(turn)
        name = match.group(1) if match else ("after_tool" if "<tool_response>" in turn else "plain")
        reasoning, content, delay = SCRIPTS.get(name, SCRIPTS["plain"])
        return reasoning, content, delay, name

    async def generate(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        checkpoint_positions: Sequence[int] = (),
        *,
        thinking: bool = True,
    ) -> AsyncIterator[Event]:
        ids = list(prompt_token_ids)
        n = len(ids)
        scheduler = self.config.scheduler
        if n >= scheduler.max_context:
            reason = FinishReason.rejected(RejectCode.CONTEXT_LENGTH, f"prompt of {n} tokens does not fit")
            yield FinishEvent(request_id, reason, n, 0, 0)
            return
        if self._stats.num_running >= scheduler.max_concurrency + scheduler.max_pending_requests:
            yield FinishEvent(request_id, FinishReason.rejected(RejectCode.OVERLOADED, "queue full"), n, 0, 0)
            return
        cached = self._cached(ids, tuple(checkpoint_positions))
        self._prompts.append((ids, tuple(checkpoint_positions)))
        prompt = self.tokenizer.decode(ids)
        reasoning, content, delay, name = self._script(prompt)
        in_reasoning = prompt_ends_in_reasoning(prompt)
        text = (reasoning + THINK_CLOSE if in_reasoning else "") + content
        end = [self.tokenizer.special_ids.im_end_id or 0]
        out = self.tokenizer.encode(text) + end
        budget, think_end = params.thinking_budget, self.tokenizer.special_ids.think_end_id
        if in_reasoning and budget is not None and budget >= 0 and out.index(think_end) > budget:
            # as the engine's scheduler does: the reasoning is closed once the budget is spent
            out = out[:budget] + self.tokenizer.encode(THINK_CLOSE + content) + end
        limit = min(params.max_tokens or scheduler.default_max_tokens, scheduler.max_context - n)
        self._stats.num_running += 1
        self._stats.num_requests_added += 1
        emitted = 0
        try:
            for token in out:
                if request_id in self._aborted:
                    self._stats.num_aborted += 1
                    yield FinishEvent(request_id, FinishReason.aborted(), n, emitted, cached)
                    return
                if emitted >= limit:
                    kind = FinishReason.length() if limit == params.max_tokens else FinishReason.context()
                    yield FinishEvent(request_id, kind, n, emitted, cached)
                    return
                emitted += 1
                yield TokenEvent(request_id, (token,), emitted)
                await asyncio.sleep(1.0 if name == "pause" and emitted == 1 else delay)
            yield FinishEvent(request_id, FinishReason.stop(out[-1]), n, emitted, cached)
        finally:
            self._stats.num_running -= 1
            self._aborted.discard(request_id)
