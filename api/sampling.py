"""Request sampling fields -> `SamplingParams`, with field-named 400s."""

from __future__ import annotations

from typing import Any

from api.errors import invalid
from engine.request import SamplingParams

MAX_STOPS = 4


def stop_strings(stop: str | list[str] | None, *, param: str = "stop") -> tuple[str, ...]:
    if stop is None:
        return ()
    stops = [stop] if isinstance(stop, str) else list(stop)
    if len(stops) > MAX_STOPS:
        raise invalid(f"at most {MAX_STOPS} stop sequences are supported, got {len(stops)}", param=param)
    if any(not s for s in stops):
        raise invalid("stop sequences must be non-empty strings", param=param)
    return tuple(stops)


def sampling_params(
    fields: Any, *, max_tokens: int | None, stop: tuple[str, ...], names: dict[str, str] | None = None
) -> SamplingParams:
    """Build from a schema with temperature/top_p/top_k/min_p/penalties/seed; bad values are 400s."""
    names = names or {}
    try:
        return SamplingParams(
            max_tokens=max_tokens,
            temperature=fields.temperature,
            top_p=fields.top_p,
            top_k=fields.top_k,
            min_p=getattr(fields, "min_p", None),
            presence_penalty=getattr(fields, "presence_penalty", None),
            frequency_penalty=getattr(fields, "frequency_penalty", None),
            seed=getattr(fields, "seed", None),
            stop=stop,
        )
    except ValueError as exc:
        name = str(exc).split("=", 1)[0]
        raise invalid(str(exc), param=names.get(name, name)) from None
