"""The tokenizer of a served model: encode, decode, chat template, special ids, incremental detokenizing.

A `Tokenizer` is built from an artifact's resources (HF-style `tokenizer.json`, `tokenizer_config.json`,
chat template text, `generation_config.json`; at the top level, or under `frontend/` as the published files
keep them: `Tokenizer.from_resources`); it owns no request state. `IncrementalDetokenizer` turns
one request's generated ids into text deltas: it never splits a UTF-8 character across deltas and holds
back any tail that could still become a stop string, so a stop string never leaks to the client.

This module must not import the model, the cache or the scheduler; the API layer and the engine's
serving loop are its users.
"""

from __future__ import annotations

import codecs
import functools
import json
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer as HFTokenizer

from engine.chat.template import render_chat_template

FRONTEND_PREFIX = "frontend/"  # where the published artifacts keep the tokenizer, chat template and configs


@dataclass(frozen=True, slots=True)
class SpecialTokenIds:
    """Ids the engine and the parsers need; `None` where the vocabulary has no such token."""

    eos_token_ids: tuple[int, ...]
    pad_token_id: int | None
    im_start_id: int | None
    im_end_id: int | None
    think_start_id: int | None
    think_end_id: int | None
    tool_call_start_id: int | None
    tool_call_end_id: int | None


def _as_dict(value: bytes | str | Mapping[str, Any] | None) -> dict[str, Any]:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return dict(value)
    return dict(json.loads(value))


def _ids_of(value: Any) -> list[int]:
    if value is None:
        return []
    if isinstance(value, int):
        return [value]
    return [int(v) for v in value]


class Tokenizer:
    """A byte-level BPE tokenizer with its chat template and generation defaults."""

    def __init__(
        self,
        tokenizer_json: bytes | str,
        tokenizer_config: bytes | str | Mapping[str, Any] | None,
        chat_template: str | None,
        generation_config: bytes | str | Mapping[str, Any] | None = None,
    ) -> None:
        self._json = tokenizer_json.decode("utf-8") if isinstance(tokenizer_json, bytes) else tokenizer_json
        self._hf = HFTokenizer.from_str(self._json)
        self._hf_literal: HFTokenizer | None = None
        self._lock = threading.Lock()
        self.config = _as_dict(tokenizer_config)
        self.generation_config = _as_dict(generation_config)
        template = chat_template if chat_template is not None else self.config.get("chat_template")
        if template is not None and not isinstance(template, str):
            raise ValueError("chat_template must be one Jinja template string")
        self.chat_template: str | None = template
        added = self._hf.get_added_tokens_decoder()
        self._special_ids = frozenset(i for i, tok in added.items() if tok.special)
        self.vocab_size = self._hf.get_vocab_size(with_added_tokens=True)

    @classmethod
    def from_resources(cls, names: Iterable[str], read: Callable[[str], bytes], where: str) -> Tokenizer:
        """Load from an artifact's resources (``names``; ``read(name)`` -> bytes): each file at the top level
        (what ``ninfer-artifact convert`` writes) or under ``frontend/`` (the published artifacts' layout:
        ``frontend/tokenizer.json``, ``frontend/chat_template.jinja``, ...). ValueError naming ``where`` when
        there is no ``tokenizer.json`` in either place."""
        present = set(names)

        def get(name: str) -> bytes | None:
            for candidate in (name, FRONTEND_PREFIX + name):
                if candidate in present:
                    return read(candidate)
            return None

        tokenizer_json = get("tokenizer.json")
        if tokenizer_json is None:
            raise ValueError(
                f"{where}: the artifact carries no tokenizer.json (nor {FRONTEND_PREFIX}tokenizer.json)"
            )
        template = get("chat_template.jinja")
        return cls(
            tokenizer_json,
            get("tokenizer_config.json"),
            template.decode("utf-8") if template is not None else None,
            get("generation_config.json"),
        )

    @classmethod
    def from_dir(cls, path: str | Path) -> Tokenizer:
        """Load from a Hugging Face checkpoint directory (`tokenizer.json` and friends)."""
        root = Path(path)
        config = root / "tokenizer_config.json"
        generation = root / "generation_config.json"
        template = root / "chat_template.jinja"
        return cls(
            (root / "tokenizer.json").read_bytes(),
            config.read_bytes() if config.is_file() else None,
            template.read_text(encoding="utf-8") if template.is_file() else None,
            generation.read_bytes() if generation.is_file() else None,
        )

    @classmethod
    def qwen35(cls, *, moe: bool = False) -> Tokenizer:
        """The real Qwen3.5 tokenizer with NInfer's chat template, built offline.

        The converted `tokenizer.json` is cached on disk; use `qwen35_tokenizer()` to also share one
        loaded instance per process (a load takes about 1.5 s).
        """
        from engine.chat import qwen35

        return cls(
            qwen35.build_qwen35_tokenizer_json(),
            qwen35.qwen35_tokenizer_config(),
            qwen35.qwen35_chat_template(),
            qwen35.qwen35_generation_config(moe=moe),
        )

    # -- ids <-> text -----------------------------------------------------------------------------

    def encode(self, text: str, *, allow_special: bool = True) -> list[int]:
        """Token ids of `text`. With `allow_special=False`, special-token strings are encoded as text."""
        if allow_special:
            return list(self._hf.encode(text, add_special_tokens=False).ids)
        return list(self._literal().encode(text, add_special_tokens=False).ids)

    def decode(self, ids: Iterable[int], *, skip_special_tokens: bool = False) -> str:
        return str(self._hf.decode(list(ids), skip_special_tokens=skip_special_tokens))

    def _literal(self) -> HFTokenizer:
        with self._lock:
            if self._hf_literal is None:
                literal = HFTokenizer.from_str(self._json)
                literal.encode_special_tokens = True
                self._hf_literal = literal
            return self._hf_literal

    def to_json(self) -> str:
        """The HF `tokenizer.json` text (grammar engines build their own vocabulary from it)."""
        return self._json

    def token_to_id(self, token: str) -> int | None:
        value = self._hf.token_to_id(token)
        return None if value is None else int(value)

    def is_special(self, token_id: int) -> bool:
        """True for control tokens (removed by `skip_special_tokens`); markup like `<think>` is not."""
        return token_id in self._special_ids

    @cached_property
    def token_bytes(self) -> tuple[bytes, ...]:
        """The UTF-8 bytes each id stands for (index = id); built on first use (~0.3 s for 248k ids)."""
        from engine.chat.qwen35 import byte_to_unicode

        to_byte = {ch: b for b, ch in enumerate(byte_to_unicode())}
        table = [b""] * self.vocab_size
        for token, token_id in self._hf.get_vocab(with_added_tokens=False).items():
            table[token_id] = bytes(to_byte[ch] for ch in token)
        for token_id, added in self._hf.get_added_tokens_decoder().items():
            table[token_id] = added.content.encode("utf-8")
        return tuple(table)

    # -- special ids ------------------------------------------------------------------------------

    @cached_property
    def special_ids(self) -> SpecialTokenIds:
        eos = _ids_of(self.generation_config.get("eos_token_id"))
        eos_text = self.config.get("eos_token")
        eos_id = self.token_to_id(eos_text) if isinstance(eos_text, str) else None
        if eos_id is not None and eos_id not in eos:
            eos.append(eos_id)
        pad = self.generation_config.get("pad_token_id")
        pad_text = self.config.get("pad_token")
        if pad is None and isinstance(pad_text, str):
            pad = self.token_to_id(pad_text)
        return SpecialTokenIds(
            eos_token_ids=tuple(eos),
            pad_token_id=None if pad is None else int(pad),
            im_start_id=self.token_to_id("<|im_start|>"),
            im_end_id=self.token_to_id("<|im_end|>"),
            think_start_id=self.token_to_id("<think>"),
            think_end_id=self.token_to_id("</think>"),
            tool_call_start_id=self.token_to_id("<tool_call>"),
            tool_call_end_id=self.token_to_id("</tool_call>"),
        )

    @property
    def eos_token_ids(self) -> tuple[int, ...]:
        return self.special_ids.eos_token_ids

    # -- chat -------------------------------------------------------------------------------------

    def apply_chat_template(
        self,
        messages: Sequence[Mapping[str, Any]],
        tools: Sequence[Mapping[str, Any]] | None = None,
        add_generation_prompt: bool = True,
        enable_thinking: bool = True,
        preserve_thinking: bool = False,
        **kwargs: Any,
    ) -> str:
        """The prompt text for `messages` (raises `ChatTemplateError`, a ValueError, on bad input).

        Extra keyword arguments reach the template (`add_vision_id`) or the renderer
        (`continue_final_message=True` for an assistant prefill, with `add_generation_prompt=False`).
        """
        if self.chat_template is None:
            raise ValueError("this tokenizer has no chat template")
        return render_chat_template(
            self.chat_template,
            messages,
            tools=tools,
            add_generation_prompt=add_generation_prompt,
            enable_thinking=enable_thinking,
            preserve_thinking=preserve_thinking,
            **kwargs,
        )


class StopMatcher:
    """The first stop string in a text that arrives in pieces.

    `push(text)` returns the text that can be released now and the stop string found right after it (None
    when there is none yet); a tail that could still begin a stop string is held back (all of it with
    `final`). After a match the stop string and what follows it stay held: a caller that passes over the
    match (it is not one, e.g. it lies inside a tool call's markup) takes them back with `skip(matched)`.
    """

    def __init__(self, stop: Sequence[str]) -> None:
        if any(not s for s in stop):
            raise ValueError("stop strings must be non-empty")
        self.stop = tuple(stop)
        self._held = ""

    def push(self, text: str, *, final: bool = False) -> tuple[str, str | None]:
        held = self._held + text
        match_at, matched = -1, None
        for s in self.stop:
            i = held.find(s)
            if i >= 0 and (match_at < 0 or i < match_at or (i == match_at and len(s) > len(matched or ""))):
                match_at, matched = i, s
        if matched is not None:
            self._held = held[match_at:]
            return held[:match_at], matched
        keep = 0 if final else self._partial_stop_len(held)
        self._held = held[len(held) - keep :]
        return held[: len(held) - keep], None

    def skip(self, matched: str) -> str:
        """Pass over the match `push` just returned: the text held after the stop string (push it again)."""
        assert self._held.startswith(matched), "skip() follows a push() that matched"
        rest, self._held = self._held[len(matched) :], ""
        return rest

    def _partial_stop_len(self, text: str) -> int:
        """Length of the longest suffix of `text` that is a proper prefix of some stop string."""
        best = 0
        for s in self.stop:
            for n in range(min(len(s) - 1, len(text)), best, -1):
                if text.endswith(s[:n]):
                    best = n
                    break
        return best


class IncrementalDetokenizer:
    """Text deltas for one request's generated ids, fed one (or a few) at a time.

    - A multi-byte UTF-8 character split over several tokens is emitted once it is complete.
    - With `stop` strings, a tail of the text that could be the start of a stop string is held back
      until it can no longer match; on a match the text before it is emitted (plus the stop string
      when `include_stop`), `stop_matched` is set, and later tokens are ignored.
    - `finish()` flushes what is held (an incomplete character becomes U+FFFD, as in `decode`).
    Concatenated deltas equal `tokenizer.decode(ids, skip_special_tokens=...)` cut at the stop string.
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        *,
        stop: Sequence[str] = (),
        skip_special_tokens: bool = True,
        include_stop: bool = False,
    ) -> None:
        self._tokenizer = tokenizer
        self._table = tokenizer.token_bytes
        self._skip_special = skip_special_tokens
        self._stops = StopMatcher(stop)
        self._include_stop = include_stop
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.stop_matched: str | None = None
        self.finished = False

    def add(self, token_id: int) -> str:
        """Feed one generated id; return the text that can be shown now (possibly empty)."""
        if self.stop_matched is not None or self.finished:
            return ""
        if token_id < 0:
            raise ValueError(f"token id {token_id} is negative")
        # NOTE: the embedding is padded past the token domain (248,077 of 248,320 for Qwen3.5); such ids
        # have no text, exactly as `decode` drops them.
        if token_id >= len(self._table) or (self._skip_special and self._tokenizer.is_special(token_id)):
            return ""
        return self._release(self._utf8.decode(self._table[token_id]), final=False)

    def add_many(self, token_ids: Iterable[int]) -> str:
        return "".join(self.add(t) for t in token_ids)

    def finish(self) -> str:
        """End of generation: return everything still held back."""
        if self.stop_matched is not None or self.finished:
            return ""
        text = self._release(self._utf8.decode(b"", final=True), final=True)
        self.finished = True
        return text

    def _release(self, text: str, *, final: bool) -> str:
        out, matched = self._stops.push(text, final=final)
        if matched is not None:
            self.stop_matched = matched
            return out + (matched if self._include_stop else "")
        return out


@functools.lru_cache(maxsize=2)
def qwen35_tokenizer(*, moe: bool = False) -> Tokenizer:
    """One shared `Tokenizer.qwen35()` per process (a Tokenizer holds no request state)."""
    return Tokenizer.qwen35(moe=moe)
