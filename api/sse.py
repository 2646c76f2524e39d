"""Server-sent events: framing, and a `: keep-alive` comment after a stretch of silence."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

KEEPALIVE = ": keep-alive\n\n"


def sse_data(payload: Any) -> str:
    return f"data: {json.dumps(payload, ensure_ascii=False)}\n\n"


def sse_event(name: str, payload: Any) -> str:
    return f"event: {name}\ndata: {json.dumps(payload, ensure_ascii=False)}\n\n"


async def with_keepalive(frames: AsyncIterator[str], seconds: float) -> AsyncIterator[str]:
    """Pass `frames` through, inserting a keep-alive comment whenever none came for `seconds`.

    The pending `__anext__` is never cancelled by the timeout (that would kill the generator); it is
    cancelled, and the source closed, only when this iterator itself is closed (client gone).
    """
    source = aiter(frames)
    pending: asyncio.Task[str] | None = None
    try:
        while True:
            if pending is None:
                pending = asyncio.ensure_future(anext(source))
            done, _ = await asyncio.wait({pending}, timeout=seconds)
            if not done:
                yield KEEPALIVE
                continue
            try:
                frame = pending.result()
            except StopAsyncIteration:
                return
            finally:
                pending = None if done else pending
            yield frame
    finally:
        if pending is not None and not pending.done():
            pending.cancel()
            try:
                await pending
            except (asyncio.CancelledError, StopAsyncIteration):
                pass
        aclose = getattr(source, "aclose", None)
        if aclose is not None:
            await aclose()
