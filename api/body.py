"""Reading a JSON request body into a pydantic model, with 400s that name the offending field."""

from __future__ import annotations

import json
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError

from api.errors import ApiError

M = TypeVar("M", bound=BaseModel)


async def read_json(request: Request) -> dict[str, Any]:
    raw = await request.body()
    try:
        body = json.loads(raw) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the request body is not valid JSON: {exc}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "the request body must be a JSON object")
    return body


def validate(model: type[M], body: dict[str, Any]) -> M:
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = _loc(first.get("loc", ()))
        if first.get("type") == "extra_forbidden":
            raise ApiError(400, "unknown_parameter", f"unknown parameter: {param!r}", param=param) from None
        if first.get("type") == "missing":
            raise ApiError(400, "missing_required_parameter", f"{param!r} is required", param=param) from None
        raise ApiError(400, "invalid_request", f"{param}: {first.get('msg')}", param=param) from None


def _loc(loc: Any) -> str:
    out = ""
    for part in loc:
        if isinstance(part, int):
            out += f"[{part}]"
        else:
            out += ("." if out else "") + str(part)
    return out
