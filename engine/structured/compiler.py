"""Compiling `StructuredSpec` grammars against the served tokenizer, with a bounded cache.

Owns: the llguidance tokenizer (built once, lazily: seconds for a 248K vocabulary), the compile limits,
and an LRU of compiled grammars keyed by grammar text: each entry is a fresh `LLMatcher` that is
never advanced; a request gets a `deep_copy()` (microseconds). Thread-safe: the API compiles (to refuse
a bad grammar with a 400 before admission) and the engine loop copies, from different threads.
Must not touch: requests, tensors, HTTP.

Compile time is bounded by `engine/structured/schema.py`'s size limits before llguidance sees a schema
and by `LIMITS` inside it (grammar size, lexer fuel, Earley items per step); a grammar over a limit is a
`StructuredError`, never a hang.
"""

from __future__ import annotations

import functools
import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING

from engine.structured.schema import StructuredError
from engine.structured.spec import StructuredSpec

if TYPE_CHECKING:
    import llguidance

    from engine.tokenizer import Tokenizer

CACHE_SIZE = 256  # compiled grammars kept


def _limits() -> llguidance.LLParserLimits:
    import llguidance

    return llguidance.LLParserLimits(
        max_grammar_size=200_000, initial_lexer_fuel=1_000_000, step_lexer_fuel=200_000, verbose_errors=False
    )


class GrammarCompiler:
    """Use: `check(spec)` (raises `StructuredError`), then `matcher(spec)` per request."""

    def __init__(self, tokenizer: Tokenizer, vocab_size: int) -> None:
        """vocab_size: the width of the model's logits (at least the tokenizer's vocabulary)."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        ids = tokenizer.special_ids
        self.think_end_id = ids.think_end_id
        self.eos_token_ids: tuple[int, ...] = tuple(ids.eos_token_ids)
        self._ll_tokenizer: llguidance.LLTokenizer | None = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[str, llguidance.LLMatcher] = OrderedDict()

    @property
    def ll_tokenizer(self) -> llguidance.LLTokenizer:
        with self._lock:
            if self._ll_tokenizer is None:
                self._ll_tokenizer = _ll_tokenizer(
                    self.tokenizer.to_json(), self.vocab_size, self.eos_token_ids
                )
            return self._ll_tokenizer

    def token_id(self, text: str) -> int:
        """The id of a special token such as `<tool_call>`; `StructuredError` if it is not one token."""
        token_id = self.tokenizer.token_to_id(text)
        if token_id is None:
            raise StructuredError("tools", "", f"this model's vocabulary has no single {text} token")
        return token_id

    def regex_error(self, pattern: str) -> str:
        """ "" when llguidance accepts `pattern` as a JSON-schema regex, else its message."""
        import llguidance

        grammar = llguidance.LLMatcher.grammar_from_json_schema({"type": "string", "pattern": pattern})
        return llguidance.LLMatcher.validate_grammar(grammar, None, limits=_limits())

    def check(self, spec: StructuredSpec) -> None:
        """Compile `spec` (or find it cached); raise `StructuredError` if it cannot be enforced."""
        self._compiled(spec)
        if spec.trigger is not None:
            self.token_id(spec.trigger)
        if spec.in_reasoning and self.think_end_id is None:
            raise StructuredError(spec.what, "", "this model's vocabulary has no </think> token")

    def matcher(self, spec: StructuredSpec) -> llguidance.LLMatcher:
        """A fresh matcher at the start of `spec`'s grammar (compiled once per distinct grammar)."""
        return self._compiled(spec).deep_copy()

    def _compiled(self, spec: StructuredSpec) -> llguidance.LLMatcher:
        with self._lock:
            found = self._cache.get(spec.grammar)
            if found is not None:
                self._cache.move_to_end(spec.grammar)
                return found
        import llguidance

        matcher = llguidance.LLMatcher(self.ll_tokenizer, spec.grammar, log_level=0, limits=_limits())
        if matcher.is_error():
            raise StructuredError(spec.what, "", _first_line(matcher.get_error()))
        with self._lock:
            self._cache[spec.grammar] = matcher
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)
        return matcher

    def num_cached(self) -> int:
        with self._lock:
            return len(self._cache)


@functools.lru_cache(maxsize=4)  # per process: engines of one model share it (seconds to build)
def _ll_tokenizer(
    tokenizer_json: str, vocab_size: int, eos_token_ids: tuple[int, ...]
) -> llguidance.LLTokenizer:
    import llguidance

    return llguidance.LLTokenizer(tokenizer_json, n_vocab=vocab_size, eos_token=list(eos_token_ids))


def _first_line(message: str) -> str:
    lines: Sequence[str] = [line for line in message.splitlines() if line.strip()]
    return lines[0] if lines else "the grammar could not be compiled"
