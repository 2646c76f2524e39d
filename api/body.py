"""Reading a JSON request body into a pydantic model, with 400s that name the offending field."""

from __future__ import annotations

import json
import re
from typing import Any, TypeVar

from fastapi import Request
from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect

from api.errors import ApiError

M = TypeVar("M", bound=BaseModel)
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


async def read_json(request: Request) -> dict[str, Any]:
    try:
        raw = await request.body()
    except ClientDisconnect:  # cut while uploading: not a server error; the gate logs the ending
        raise ApiError(400, "client_disconnected", "the client closed the connection mid-body") from None
    try:  # strict UTF-8 first: json.loads(bytes) would let raw surrogate bytes (ED A0 80) through
        body = json.loads(raw.decode("utf-8")) if raw else None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ApiError(400, "invalid_json", f"the request body is not valid JSON: {exc}") from None
    except RecursionError:
        raise ApiError(400, "invalid_json", "the request body is nested too deeply") from None
    if _SURROGATE_ESCAPE.search(raw):  # a lone \ud800-\udfff escape decodes to a str no tokenizer takes
        try:
            json.dumps(body, ensure_ascii=False).encode("utf-8")
        except UnicodeEncodeError:
            raise ApiError(
                400, "invalid_json", "the request body has a lone UTF-16 surrogate escape (\\ud800-\\udfff)"
            ) from None
    if not isinstance(body, dict):
        raise ApiError(400, "invalid_request", "the request body must be a JSON object")
    return body


def json_body_doc(model: type[BaseModel]) -> dict[str, Any]:
    """`openapi_extra` for a route that reads its JSON body itself (`read_json` + `validate`): documents
    `model` as the required request body in the served OpenAPI schema."""
    schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
    assert "$defs" not in schema, f"{model.__name__}: nested models need components in the OpenAPI doc"
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


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
