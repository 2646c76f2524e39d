"""Anthropic routes: `POST /v1/messages` (streamed or not) and `POST /v1/messages/count_tokens`."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, StreamingResponse

from api.anthropic import convert
from api.anthropic.schemas import CountTokensRequest, MessagesRequest
from api.body import json_body_doc, read_json, validate
from api.errors import ApiError, anthropic_body
from api.generation import Generation
from api.prompt import build_prompt, check_fits
from api.sse import sse_event, with_keepalive
from api.state import new_id, server_state
from api.tracking import Tracker, collect

router = APIRouter()

SSE_HEADERS = {"Cache-Control": "no-cache", "X-Accel-Buffering": "no"}


@router.post("/v1/messages", openapi_extra=json_body_doc(MessagesRequest))
async def create_message(request: Request) -> Any:
    state = server_state(request)
    req = validate(MessagesRequest, await read_json(request))
    plan = convert.messages_plan(req, state.options)
    prompt = build_prompt(
        state.engine.tokenizer,
        plan.messages,
        tools=plan.tools,
        thinking=plan.thinking,
        preserve_thinking=state.options.preserve_thinking,
        prefill=plan.prefill,
    )
    request_id = request.state.request_id
    tracker = Tracker(
        state,
        request_id,
        "anthropic.messages",
        model=req.model,
        stream=req.stream,
        num_tools=len(plan.tools or ()),
        thinking=plan.thinking,
        thinking_type=(req.thinking or {}).get("type"),
        thinking_budget=plan.thinking_budget,
        max_tokens=plan.max_tokens,
        prompt_tokens=len(prompt.token_ids),
    )
    try:
        check_fits(prompt, state.max_context)
    except ApiError as exc:
        tracker.rejected(exc)
        raise
    generation = Generation(
        state.engine,
        request_id,
        prompt,
        plan.params,
        tools=plan.tools,
        calls_in_reasoning=state.options.tolerant_tool_calls,
        thinking_budget=plan.thinking_budget,
    )
    await tracker.begin(generation)
    message_id = new_id("msg_")
    if not req.stream:
        events = await collect(tracker, generation, request)
        return JSONResponse(convert.message_response(message_id, req.model, events, generation.outcome))
    frames = _message_frames(generation, message_id, req.model)
    body = with_keepalive(tracker.stream(generation, frames), state.options.keepalive_seconds)
    return StreamingResponse(body, media_type="text/event-stream", headers=SSE_HEADERS)


async def _message_frames(generation: Generation, message_id: str, model: str) -> AsyncIterator[str]:
    outcome = generation.outcome
    start: dict[str, Any] = {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": [],
        "stop_reason": None,
        "stop_sequence": None,
        "usage": convert.usage(outcome),
    }
    yield sse_event("message_start", {"type": "message_start", "message": start})
    writer = convert.BlockWriter()
    try:
        async for event in generation.events():
            for name, payload in writer.event(event):
                yield sse_event(name, payload)
    except ApiError as exc:
        yield sse_event("error", anthropic_body(exc))
        return
    if outcome.finish == "aborted":
        yield sse_event(
            "error", anthropic_body(ApiError(503, "request_aborted", "the request was aborted by the server"))
        )
        return
    for name, payload in writer.close():
        yield sse_event(name, payload)
    delta = {
        "stop_reason": convert.stop_reason(outcome, writer.has_calls),
        "stop_sequence": outcome.stop_sequence,
    }
    yield sse_event(
        "message_delta", {"type": "message_delta", "delta": delta, "usage": convert.usage(outcome)}
    )
    yield sse_event("message_stop", {"type": "message_stop"})


@router.post("/v1/messages/count_tokens", openapi_extra=json_body_doc(CountTokensRequest))
async def count_tokens(request: Request) -> JSONResponse:
    state = server_state(request)
    req = validate(CountTokensRequest, await read_json(request))
    messages, tools, thinking, prefill = convert.count_plan(req, state.options)
    prompt = build_prompt(
        state.engine.tokenizer,
        messages,
        tools=tools,
        thinking=thinking,
        preserve_thinking=state.options.preserve_thinking,
        prefill=prefill,
    )
    return JSONResponse({"input_tokens": len(prompt.token_ids)})
