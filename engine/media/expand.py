"""From a tokenized chat prompt with one placeholder per medium to the engine's prompt: runs expanded, ``PromptMedia``.

The chat template renders each image as ``<|vision_start|><|image_pad|><|vision_end|>`` (and a video with
``<|video_pad|>``). ``expand_prompt`` prepares each medium (``image.prepare_image``, ``video.prepare_video``) in
prompt order and replaces its single placeholder with the medium's run: an image's ``num_tokens`` placeholders;
a video's frame groups, each ``<t seconds><|vision_start|>`` + its placeholders + ``<|vision_end|>``, as the
checkpoint's processor writes them. Shared by the HTTP API (api/media.py), ``ninfer --messages`` and ``LLM``.

``media_parts`` turns OpenAI-style message parts (``image_url`` / ``video_url`` with a data URI or, for local
callers, a file path; ``{"type": "image", "image": ...}``) into template parts plus the sources to load.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from engine.media.image import ImageProcessorConfig, MediaError, prepare_image
from engine.media.prompt import MediaItem, MediaTokens, PromptMedia, prompt_media


def prepare_medium(kind: str, data: bytes, processor: ImageProcessorConfig) -> tuple[MediaItem, list[float]]:
    """The tower's input for one medium, and (video) each frame group's timestamp in seconds."""
    if kind == "image":
        return MediaItem.image(prepare_image(data, processor)), []
    from engine.media.video import prepare_video  # PyAV: imported only when a video comes

    video = prepare_video(data, processor)
    return video.item, list(video.timestamps)


def expand_prompt(
    token_ids: Sequence[int],
    media: Sequence[tuple[str, bytes]],
    tokens: MediaTokens,
    processor: ImageProcessorConfig,
    encode: Callable[[str], list[int]],
    max_media_tokens: int,
) -> tuple[list[int], PromptMedia]:
    """``MediaError`` (``.index``: which medium, -1 for the prompt) when a medium cannot be used."""
    pads = {"image": tokens.image_token_id, "video": tokens.video_token_id}
    found = [t for t in token_ids if t in pads.values()]
    if found != [pads[kind] for kind, _ in media]:
        raise _at(
            MediaError("the prompt's placeholder tokens do not match its media (one per image / video)"), -1
        )
    items: list[MediaItem] = []
    ids: list[int] = []
    total = 0
    for token in token_ids:
        if token not in pads.values():
            ids.append(token)
            continue
        k = len(items)
        kind, data = media[k]
        try:
            item, stamps = prepare_medium(kind, data, processor)
        except MediaError as exc:
            raise _at(exc, k) from None
        total += item.num_tokens
        if total > max_media_tokens:
            raise _at(MediaError(f"the request's media take over {max_media_tokens} tokens (--max-media-tokens)",
                                 code="media_token_budget_exceeded"), k)  # fmt: skip
        items.append(item)
        if kind == "image":
            ids.extend([token] * item.num_tokens)
            continue
        if not ids or ids[-1] != tokens.vision_start_token_id:
            raise _at(MediaError("a video placeholder must follow <|vision_start|>"), k)
        ids.pop()
        per_frame = item.num_tokens // item.grid_thw[0]
        for i, stamp in enumerate(stamps):
            ids.extend(encode(f"<{stamp:.1f} seconds>"))
            ids.append(tokens.vision_start_token_id)
            ids.extend([token] * per_frame)
            if i + 1 < len(stamps):  # the template's own <|vision_end|> closes the last group
                ids.append(tokens.vision_end_token_id)
    try:
        return ids, prompt_media(ids, items, tokens)
    except MediaError as exc:
        raise _at(exc, -1) from None


def _at(exc: MediaError, index: int) -> MediaError:
    exc.index = index  # type: ignore[attr-defined]
    return exc


_PARTS = {"image_url": "image", "video_url": "video", "image": "image", "video": "video"}


def media_parts(messages: Sequence[Mapping[str, Any]]) -> tuple[list[dict[str, Any]], list[tuple[str, str]]]:
    """(messages for the template, [(kind, source)] in prompt order) from OpenAI-style parts; a source is a
    data URI or a file path (``load_source``)."""
    out: list[dict[str, Any]] = []
    sources: list[tuple[str, str]] = []
    for message in messages:
        content = message.get("content")
        if not isinstance(content, list):
            out.append(dict(message))
            continue
        parts: list[Any] = []
        for part in content:
            kind = part.get("type") if isinstance(part, Mapping) else None
            if kind not in _PARTS:
                parts.append(part)
                continue
            value = part.get(kind)
            source = value.get("url") if isinstance(value, Mapping) else value
            if not isinstance(source, str) or not source:
                raise MediaError(f"a {kind} part needs a url or a path")
            parts.append({"type": _PARTS[kind]})
            sources.append((_PARTS[kind], source))
        out.append({**message, "content": parts})
    return out, sources


def load_source(source: str) -> bytes:
    """A data URI's bytes or a local file's; ``MediaError`` otherwise (remote URLs are the HTTP server's)."""
    if source.startswith("data:"):
        header, comma, payload = source.partition(",")
        if not comma or not header.endswith(";base64"):
            raise MediaError("a data URI must be data:<type>;base64,<payload>")
        try:
            return base64.b64decode(payload, validate=True)
        except (binascii.Error, ValueError):
            raise MediaError("the data URI's payload is not valid base64") from None
    if source.startswith(("http://", "https://")):
        raise MediaError("remote URLs are not fetched here: give a file path or a data: URI")
    try:
        return Path(source).read_bytes()
    except OSError as exc:
        raise MediaError(f"cannot read {source}: {exc}") from None
