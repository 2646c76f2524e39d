"""API errors: one exception type, rendered in the shape of the protocol that the request spoke.

OpenAI:    {"error": {"message", "type", "param", "code"}}
Anthropic: {"type": "error", "error": {"type", "message"[, "details"]}}  (`details` carries an `error_code`
the SDKs act on, e.g. `thread_unsupported_request`)
The protocol is chosen by path (`/v1/messages...` is Anthropic, everything else OpenAI).
Refusals a client should retry (429, 503, Anthropic's 529) carry a `Retry-After` header.
"""

from __future__ import annotations

from typing import Any

from fastapi.responses import JSONResponse

# HTTP status -> Anthropic error type (https://docs.anthropic.com/en/api/errors).
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    503: "api_error",
    504: "timeout_error",
    529: "overloaded_error",
}
# HTTP status -> OpenAI error type.
_OPENAI_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    408: "timeout_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    503: "service_unavailable",
    504: "timeout_error",
}


class ApiError(Exception):
    """A request the server answers with a 4xx/5xx: status, machine code, optional field, message."""

    def __init__(
        self,
        status: int,
        code: str,
        message: str,
        *,
        param: str | None = None,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.message = message
        self.param = param
        self.details = details

    def __repr__(self) -> str:
        return f"ApiError({self.status}, {self.code!r}, {self.message!r}, param={self.param!r})"


def invalid(message: str, *, param: str | None = None, code: str = "invalid_request") -> ApiError:
    return ApiError(400, code, message, param=param)


def is_anthropic_path(path: str) -> bool:
    return path.startswith("/v1/messages")


def openai_body(error: ApiError) -> dict[str, Any]:
    return {
        "error": {
            "message": error.message,
            "type": _OPENAI_TYPES.get(error.status, "server_error"),
            "param": error.param,
            "code": error.code,
        }
    }


def anthropic_body(error: ApiError) -> dict[str, Any]:
    """Anthropic has no `param` field: the message names the field, once."""
    param = error.param
    message = error.message if param is None or param in error.message else f"{param}: {error.message}"
    body: dict[str, Any] = {
        "type": _ANTHROPIC_TYPES.get(anthropic_status(error), "api_error"),
        "message": message,
    }
    if error.details is not None:
        body["details"] = error.details
    return {"type": "error", "error": body}


def anthropic_status(error: ApiError) -> int:
    """Anthropic spells overload 529 and queue timeouts 504."""
    if error.code == "server_overloaded":
        return 529
    if error.code == "request_queue_timeout":
        return 504
    return error.status


RETRY_STATUSES = (429, 503, 529)
RETRY_AFTER_SECONDS = "1"


def error_status(error: ApiError, path: str) -> int:
    """The HTTP status `error` is sent with on `path` (Anthropic spells some differently)."""
    return anthropic_status(error) if is_anthropic_path(path) else error.status


def error_response(error: ApiError, path: str, headers: dict[str, str] | None = None) -> JSONResponse:
    status = error_status(error, path)
    if status in RETRY_STATUSES:
        headers = {"Retry-After": RETRY_AFTER_SECONDS, **(headers or {})}
    body = anthropic_body(error) if is_anthropic_path(path) else openai_body(error)
    return JSONResponse(body, status_code=status, headers=headers)
