"""`LLM`: offline batch generation for Python users, in the shape vLLM users know.

    llm = LLM("model.ninfer", max_context=4096, max_concurrency=4, kv_dtype="int8")
    outputs = llm.generate(["Hello", [9707, 11]], SamplingParams(temperature=0, max_tokens=32))
    outputs[0].outputs[0].text   # also outputs[0].text / .token_ids / .finish_reason

Config keywords mirror the server flags in snake_case (`max_context`, `max_concurrency`, `kv_dtype`,
`kv_capacity`, `prefill_chunk`, `prefix_reuse=False` for `--no-prefix-reuse`, `greedy`, ...; see
`EngineConfig.from_flags` and engine/flags.py's table); a refused value raises ValueError with the words
`ninfer-serve` and `ninfer` exit with (engine/config.py holds the rules). `device`, `dtype` and `seed` pick
where and how the model runs.

Images and video (`LLM(path, vision=True)`): `generate({"prompt": text, "multi_modal_data": {"image": [...]}})`
with one `<|vision_start|><|image_pad|><|vision_end|>` in the text per image (vLLM's shape; items are bytes, a
file path, a data URI or a PIL image; "video" likewise with `<|video_pad|>`), or `chat()` with `image_url` /
`video_url` parts (engine/media/expand.py). Without `vision=True` media raise `MediaError`.
Owns: one `EngineCore`, driven inline (no thread). Must not touch the scheduler's or runner's state.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, cast

import torch

from engine.config import EngineConfig
from engine.core import EngineCore, load_artifact
from engine.media.expand import expand_prompt, load_source, media_parts
from engine.media.image import MediaError
from engine.media.prompt import PromptMedia
from engine.request import FinishEvent, FinishKind, SamplingParams, TokenEvent
from engine.tokenizer import IncrementalDetokenizer, Tokenizer

PromptInput = str | Sequence[int] | Mapping[str, Any]
_Encoded = tuple[str | None, list[int], PromptMedia | None]  # text, prompt ids (media runs expanded), media

# vLLM's finish_reason strings: the context limit is a "length" stop there too.
_FINISH_REASONS = {
    FinishKind.STOP: "stop",
    FinishKind.LENGTH: "length",
    FinishKind.CONTEXT: "length",
    FinishKind.ABORTED: "abort",
}


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str  # "stop" | "length" | "abort"
    stop_reason: int | str | None  # the EOS / stop token id or the stop string that ended it


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    num_cached_tokens: int  # prompt tokens reused from a prefix checkpoint
    finished: bool = True

    @property
    def text(self) -> str:
        return self.outputs[0].text

    @property
    def token_ids(self) -> list[int]:
        return self.outputs[0].token_ids

    @property
    def finish_reason(self) -> str:
        return self.outputs[0].finish_reason


class LLM:
    def __init__(
        self,
        artifact: str | os.PathLike[str] | None = None,
        *,
        device: torch.device | str | None = None,
        dtype: torch.dtype | None = None,
        seed: int | None = None,
        **config: Any,
    ) -> None:
        """Load `artifact` (None = the embedded demo model) with `EngineConfig.from_flags(**config)`, which
        is built (and may refuse) before anything loads."""
        self.config = EngineConfig.from_flags(None if artifact is None else str(artifact), **config)
        if artifact is None:
            from engine.testing.demo import demo_artifact_path  # an entry point: it may import engine.testing

            artifact = demo_artifact_path()
        spec = self.config.spec
        loaded = load_artifact(
            artifact,
            device=device,
            dtype=dtype,
            with_mtp=spec == "mtp",
            lm_head_draft=self.config.lm_head_draft,
            with_dflash=spec == "dflash",
            with_vision=self.config.vision,
        )
        self._artifact = loaded.artifact  # keeps memory-mapped weights alive
        self.model_id = loaded.model_id
        self.tokenizer: Tokenizer = loaded.tokenizer
        self.vision = loaded.vision
        self.core = EngineCore(loaded.model, loaded.tokenizer, self.config, seed=seed, vision=loaded.vision)
        self._next_id = 0

    def get_tokenizer(self) -> Tokenizer:
        return self.tokenizer

    def generate(
        self,
        prompts: PromptInput | Sequence[PromptInput],
        sampling_params: SamplingParams | Sequence[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Generate for each prompt (text, token ids, or {"prompt": ...} / {"prompt_token_ids": ...});
        outputs come back in prompt order. A prompt that can never fit raises ValueError."""
        items = _as_prompt_list(prompts)
        params = sampling_params if sampling_params is not None else SamplingParams()
        per_prompt = [params] * len(items) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(items):
            raise ValueError(f"{len(per_prompt)} sampling params for {len(items)} prompts")
        encoded = [self._encode(item) for item in items]
        return self._run(encoded, per_prompt)

    def chat(
        self,
        messages: Sequence[Mapping[str, Any]],
        sampling_params: SamplingParams | None = None,
        *,
        tools: Sequence[Mapping[str, Any]] | None = None,
        enable_thinking: bool = True,
    ) -> RequestOutput:
        """One conversation through the chat template (the raw generated text, reasoning included)."""
        messages, sources = media_parts(messages)
        text = self.tokenizer.apply_chat_template(messages, tools=tools, enable_thinking=enable_thinking)
        ids = self.tokenizer.encode(text)
        ids, media = self._media(ids, [(kind, load_source(source)) for kind, source in sources])
        params = sampling_params if sampling_params is not None else SamplingParams()
        return self._run([(text, ids, media)], [params], thinking=enable_thinking)[0]

    def _encode(self, item: PromptInput) -> _Encoded:
        if isinstance(item, str):
            return item, self.tokenizer.encode(item), None
        if isinstance(item, Mapping):
            if "prompt_token_ids" in item:
                text, ids = item.get("prompt"), [int(t) for t in item["prompt_token_ids"]]
            else:
                text, ids = str(item["prompt"]), self.tokenizer.encode(str(item["prompt"]))
            ids, media = self._media(ids, self._multi_modal(ids, item.get("multi_modal_data") or {}))
            return text, ids, media
        return None, [int(t) for t in item], None

    def _multi_modal(self, ids: list[int], data: Mapping[str, Any]) -> list[tuple[str, bytes]]:
        """vLLM's ``multi_modal_data`` ({"image": x or [x, ...], "video": ...}) in placeholder order."""
        queues = {}
        for kind in ("image", "video"):
            value = data.get(kind, [])
            queues[kind] = deque(_medium_bytes(v) for v in (value if isinstance(value, list) else [value]))
        if not any(queues.values()):
            return []
        if self.vision is None:
            raise MediaError("media need LLM(..., vision=True)", code="vision_disabled")
        tokens = self.vision.tokens
        pads = {tokens.image_token_id: "image", tokens.video_token_id: "video"}
        order = [pads[t] for t in ids if t in pads]
        if any(order.count(kind) != len(queue) for kind, queue in queues.items()):
            raise MediaError("the prompt needs one <|vision_start|><|image_pad|><|vision_end|> per image "
                             "(<|video_pad|> per video)")  # fmt: skip
        return [(kind, queues[kind].popleft()) for kind in order]

    def _media(self, ids: list[int], media: list[tuple[str, bytes]]) -> tuple[list[int], PromptMedia | None]:
        if not media:
            return ids, None
        if self.vision is None:
            raise MediaError("media need LLM(..., vision=True)", code="vision_disabled")
        v = self.vision
        expanded, prepared = expand_prompt(ids, media, v.tokens, v.processor, self.tokenizer.encode,
                                           self.config.max_media_tokens)  # fmt: skip
        return expanded, prepared

    def _run(
        self,
        prompts: list[_Encoded],
        params: list[SamplingParams],
        *,
        thinking: bool = True,
    ) -> list[RequestOutput]:
        core = self.core
        ids = [self._new_id() for _ in prompts]
        todo = deque(range(len(prompts)))
        tokens: dict[str, list[int]] = {i: [] for i in ids}
        finish: dict[str, FinishEvent] = {}
        lanes = self.config.scheduler.max_concurrency
        try:
            while todo or core.has_work():
                # Feed only as many as can run: nothing waits long enough to hit the pending timeout.
                while todo and core.scheduler.num_running + core.scheduler.num_waiting < lanes:
                    k = todo.popleft()
                    rejection = core.add_request(
                        ids[k], prompts[k][1], params[k], thinking=thinking, media=prompts[k][2]
                    )
                    if rejection is not None:
                        raise ValueError(f"prompt {k}: {rejection.reason.message}")
                for event in core.step():
                    if isinstance(event, TokenEvent):
                        tokens[event.request_id].extend(event.token_ids)
                    else:
                        finish[event.request_id] = event
        except BaseException:
            core.abort_all("LLM.generate failed")
            raise
        return [
            self._output(i, prompt, tokens[i], finish[i], core.resolve(p, thinking=thinking))
            for i, prompt, p in zip(ids, prompts, params, strict=True)
        ]

    def _output(
        self,
        request_id: str,
        prompt: _Encoded,
        token_ids: list[int],
        finish: FinishEvent,
        params: SamplingParams,
    ) -> RequestOutput:
        text = self._text(prompt[1], token_ids, params.stop)
        reason = finish.reason
        completion = CompletionOutput(
            0, text, token_ids, _FINISH_REASONS.get(reason.kind, reason.kind.value), reason.stop_match
        )
        return RequestOutput(request_id, prompt[0], prompt[1], [completion], finish.num_cached_tokens)

    def _text(self, prompt_ids: list[int], token_ids: list[int], stop: tuple[str, ...]) -> str:
        """The output's text, cut at a stop string in the answer only (never in the reasoning, as the engine)."""
        ids = self.tokenizer.special_ids
        start, end = ids.think_start_id, ids.think_end_id
        markers = [t for t in prompt_ids if t in (start, end)]
        reasoning = bool(markers) and markers[-1] == start and start is not None
        cut = (
            token_ids.index(end) + 1
            if reasoning and end in token_ids
            else (len(token_ids) if reasoning else 0)
        )
        free = IncrementalDetokenizer(self.tokenizer)
        text = free.add_many(token_ids[:cut]) + free.finish()
        answer = IncrementalDetokenizer(self.tokenizer, stop=stop)
        return text + answer.add_many(token_ids[cut:]) + answer.finish()

    def _new_id(self) -> str:
        self._next_id += 1
        return f"llm-{self._next_id}"


def _as_prompt_list(prompts: PromptInput | Sequence[PromptInput]) -> list[PromptInput]:
    if isinstance(prompts, str | Mapping):
        return [prompts]
    items = list(prompts)
    if items and all(isinstance(t, int) for t in items):
        return [cast(list[int], items)]  # one prompt given as token ids
    # NOTE: not all ints, so by the signature `prompts` was a Sequence[PromptInput].
    return cast(list[PromptInput], items)


def _medium_bytes(value: Any) -> bytes:
    """Bytes of a medium given as bytes, a file path or data URI, or a PIL image (encoded as PNG)."""
    if isinstance(value, bytes | bytearray):
        return bytes(value)
    if isinstance(value, str | os.PathLike):
        return load_source(os.fspath(value))
    save = getattr(value, "save", None)
    if callable(save):  # a PIL image
        import io

        buf = io.BytesIO()
        save(buf, format="PNG")
        return buf.getvalue()
    raise MediaError(f"a medium must be bytes, a path, a data URI or a PIL image, not {type(value).__name__}")
