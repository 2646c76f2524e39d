"""Images and video in requests (``--vision``): protocol parts -> template parts -> the engine's ``PromptMedia``.

Each protocol's convert.py turns a media part (OpenAI ``image_url`` / ``video_url``, Responses ``input_image``,
Anthropic ``image`` with a base64 source) into a chat-template part (``{"type": "image"}``, which the template
renders as ``<|vision_start|><|image_pad|><|vision_end|>``) carrying a ``MediaRef`` under ``MEDIA_KEY``. After
the prompt is rendered and tokenized, ``attach_media`` (off the event loop) fetches each medium and hands them to
``engine.media.expand.expand_prompt`` (decode, expand each placeholder into the medium's run, ``PromptMedia``).

Sources: ``data:`` URIs (base64) and base64 blocks always; ``http(s)://`` URLs only with
``--allow-remote-media``, fetched within ``REMOTE_TIMEOUT_SECONDS`` and ``MAX_MEDIA_BYTES``. Every failure is
a 400 in the protocol's shape: ``vision_disabled`` (no ``--vision``), ``remote_media_disabled``,
``invalid_media`` (undecodable, a malformed URI, a failed fetch), ``media_too_large`` (bytes or pixels),
``media_token_budget_exceeded`` (``--max-media-tokens``).
"""

from __future__ import annotations

import base64
import binascii
import urllib.error
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from api.errors import ApiError
from api.prompt import Prompt, checkpoint_positions
from engine.media import MediaError
from engine.media.expand import expand_prompt
from engine.model.vision_load import VisionParts
from engine.tokenizer import Tokenizer

MEDIA_KEY = "ninfer_media"
MAX_MEDIA_BYTES = 32 * 1024 * 1024  # one medium, decoded from base64 or fetched
REMOTE_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class MediaRef:
    """One medium as the request gave it: a URL (data: or http(s):) or bytes, and the field that named it."""

    kind: str  # "image" | "video"
    param: str
    url: str | None = None
    data: bytes | None = None


def template_part(
    kind: str, param: str, *, url: str | None = None, data: bytes | None = None
) -> dict[str, Any]:
    """The chat template's part for a medium (the ref rides along; the template ignores the key)."""
    return {"type": kind, MEDIA_KEY: MediaRef(kind, param, url, data)}


def media_refs(messages: Sequence[Mapping[str, Any]]) -> list[MediaRef]:
    """The refs of ``messages``' media parts, in the order the template renders them."""
    refs: list[MediaRef] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, list):
            refs.extend(p[MEDIA_KEY] for p in content if isinstance(p, Mapping) and MEDIA_KEY in p)
    return refs


def _error(code: str, message: str, param: str) -> ApiError:
    return ApiError(400, code, message, param=param)


def fetch(ref: MediaRef, allow_remote: bool) -> bytes:
    """The medium's bytes (``ApiError`` 400 when they cannot be had within the limits)."""
    if ref.data is not None:
        data = ref.data
    elif ref.url is None:
        raise _error("invalid_media", f"the {ref.kind} has no url or data", ref.param)
    elif ref.url.startswith("data:"):
        header, comma, payload = ref.url.partition(",")
        if not comma or not header.endswith(";base64"):
            raise _error("invalid_media", "a data URI must be data:<type>;base64,<payload>", ref.param)
        if len(payload) > MAX_MEDIA_BYTES * 4 // 3 + 4:
            raise _error("media_too_large", f"the {ref.kind} is over {MAX_MEDIA_BYTES} bytes", ref.param)
        data = decode_base64(payload, ref.param)
    elif ref.url.startswith(("http://", "https://")):
        if not allow_remote:
            raise _error(
                "remote_media_disabled",
                "remote media URLs are refused by this server (start it with --allow-remote-media); "
                "send the bytes as a data: URI",
                ref.param,
            )
        data = _download(ref)
    else:
        raise _error("invalid_media", "the url must be a data: URI or an http(s) URL", ref.param)
    if len(data) > MAX_MEDIA_BYTES:
        raise _error("media_too_large", f"the {ref.kind} is over {MAX_MEDIA_BYTES} bytes", ref.param)
    return data


def decode_base64(payload: str, param: str) -> bytes:
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _error("invalid_media", "the media payload is not valid base64", param) from None


def _download(ref: MediaRef) -> bytes:
    assert ref.url is not None
    try:
        with urllib.request.urlopen(ref.url, timeout=REMOTE_TIMEOUT_SECONDS) as response:  # noqa: S310
            data: bytes = response.read(MAX_MEDIA_BYTES + 1)
    except (urllib.error.URLError, TimeoutError, OSError, ValueError) as exc:
        raise _error("invalid_media", f"fetching the {ref.kind} failed: {exc}", ref.param) from None
    if len(data) > MAX_MEDIA_BYTES:
        raise _error("media_too_large", f"the {ref.kind} is over {MAX_MEDIA_BYTES} bytes", ref.param)
    return data


def attach_media(
    prompt: Prompt,
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Tokenizer,
    vision: VisionParts | None,
    *,
    allow_remote: bool,
    max_media_tokens: int,
) -> Prompt:
    """``prompt`` with its placeholders expanded and its ``PromptMedia`` (unchanged when it has no media)."""
    refs = media_refs(messages)
    if not refs:
        return prompt
    if vision is None:
        raise _error("vision_disabled", "this server was started without --vision: images and video are refused",
                     refs[0].param)  # fmt: skip
    media = [(ref.kind, fetch(ref, allow_remote)) for ref in refs]
    try:
        ids, prepared = expand_prompt(
            prompt.token_ids, media, vision.tokens, vision.processor, tokenizer.encode, max_media_tokens
        )
    except MediaError as exc:
        index = getattr(exc, "index", -1)
        raise _error(exc.code, str(exc), refs[index].param if index >= 0 else "messages") from None
    return replace(
        prompt,
        token_ids=ids,
        checkpoint_positions=checkpoint_positions(ids, tokenizer.special_ids.im_end_id),
        media=prepared,
    )


def prompt_with_media(engine: Any, messages: Sequence[Mapping[str, Any]], prompt: Prompt) -> Prompt:
    """``attach_media`` with the engine's vision parts and limits (an ``EngineClient``); blocking: run off the loop."""
    if not media_refs(messages):
        return prompt
    config = engine.config
    return attach_media(prompt, messages, engine.tokenizer, engine_vision(engine),
                        allow_remote=config.allow_remote_media, max_media_tokens=config.max_media_tokens)  # fmt: skip


def engine_vision(engine: object) -> VisionParts | None:
    """The engine's vision parts (None: started without --vision, or an engine without vision at all)."""
    vision = getattr(engine, "vision", None)
    return vision if isinstance(vision, VisionParts) else None
