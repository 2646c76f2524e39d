"""Images and video in requests (``--vision``): protocol parts -> template parts -> the engine's ``PromptMedia``.

Each protocol's convert.py turns a media part (OpenAI ``image_url`` / ``video_url``, Responses ``input_image``,
Anthropic ``image`` with a base64 source) into a chat-template part (``{"type": "image"}``, which the template
renders as ``<|vision_start|><|image_pad|><|vision_end|>``) carrying a ``MediaRef`` under ``MEDIA_KEY``. After
the prompt is rendered and tokenized, ``attach_media`` (off the event loop) fetches and decodes each medium in
prompt order, expands each single placeholder into the medium's run (a video: one run per frame group, each
after its ``<t seconds>`` timestamp, as the checkpoint's processor writes it) and builds the ``PromptMedia``.

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
from engine.core import check_media
from engine.media import MediaError, MediaItem, prepare_image, prompt_media
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


def prepare(ref: MediaRef, data: bytes, vision: VisionParts) -> tuple[MediaItem, list[float]]:
    """The tower's input for one medium, and (video) each frame group's timestamp in seconds."""
    if ref.kind == "image":
        return MediaItem.image(prepare_image(data, vision.processor)), []
    from engine.media.video import prepare_video  # PyAV: imported only when a video comes

    video = prepare_video(data, vision.processor)
    return video.item, list(video.timestamps)


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
    tokens = vision.tokens
    pads = {"image": tokens.image_token_id, "video": tokens.video_token_id}
    found = [t for t in prompt.token_ids if t in pads.values()]
    if found != [pads[r.kind] for r in refs]:
        raise _error(
            "invalid_media", "the prompt's text holds media placeholder tokens of its own", refs[0].param
        )
    items: list[MediaItem] = []
    ids: list[int] = []
    k = 0
    total = 0
    for token in prompt.token_ids:
        if token not in pads.values():
            ids.append(token)
            continue
        ref = refs[k]
        k += 1
        try:
            item, stamps = prepare(ref, fetch(ref, allow_remote), vision)
        except MediaError as exc:
            raise _error(exc.code, str(exc), ref.param) from None
        total += item.num_tokens
        if total > max_media_tokens:
            raise _error("media_token_budget_exceeded", f"the request's media take over {max_media_tokens} tokens "
                         "(--max-media-tokens)", ref.param)  # fmt: skip
        items.append(item)
        if ref.kind == "image":
            ids.extend([token] * item.num_tokens)
            continue
        # a video: <|vision_start|> <|video_pad|> <|vision_end|> becomes, per frame group,
        # <t seconds> <|vision_start|> <|video_pad|> * n <|vision_end|>
        assert ids and ids[-1] == tokens.vision_start_token_id, "the template opens a video with vision_start"
        ids.pop()
        per_frame = item.num_tokens // item.grid_thw[0]
        for i, stamp in enumerate(stamps):
            ids.extend(tokenizer.encode(f"<{stamp:.1f} seconds>"))
            ids.append(tokens.vision_start_token_id)
            ids.extend([token] * per_frame)
            if i + 1 < len(stamps):
                ids.append(tokens.vision_end_token_id)
    try:
        media = prompt_media(ids, items, tokens)
        check_media(media, True, max_media_tokens)
    except MediaError as exc:
        raise _error(exc.code, str(exc), refs[0].param) from None
    return replace(
        prompt,
        token_ids=ids,
        checkpoint_positions=checkpoint_positions(ids, tokenizer.special_ids.im_end_id),
        media=media,
    )


def engine_vision(engine: object) -> VisionParts | None:
    """The engine's vision parts (None: started without --vision, or an engine without vision at all)."""
    vision = getattr(engine, "vision", None)
    return vision if isinstance(vision, VisionParts) else None
