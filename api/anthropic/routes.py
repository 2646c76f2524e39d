"""Anthropic routes: `POST /v1/messages` (streamed or not) and `POST /v1/messages/count_tokens`."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api import pipeline
from api.anthropic import convert
from api.anthropic.schemas import CountTokensRequest, MessagesRequest
from api.body import json_body_doc, read_json, validate
from api.errors import ApiError, anthropic_body
from api.generation import Outcome
from api.media import prompt_with_media
from api.pipeline import Turn
from api.prompt import build_prompt
from api.sse import sse_event
from api.state import new_id, server_state
from engine.chat.parse import StreamEvent

router = APIRouter()


@router.post("/v1/messages", openapi_extra=json_body_doc(MessagesRequest))
async def create_message(request: Request) -> Any:
    state = server_state(request)
    req = validate(MessagesRequest, await read_json(request))
    plan = convert.messages_plan(req, state.options)
    turn = Turn.from_plan(
        plan,
        protocol="anthropic.messages",
        stream=req.stream,
        preserve_thinking=state.options.preserve_thinking,
        log_fields={
            "model": req.model,
            "thinking_type": (req.thinking or {}).get("type"),
            "thinking_budget": plan.thinking_budget,
        },
    )
    return await pipeline.run(state, request, turn, MessageAdapter(new_id("msg_"), req.model))


class MessageAdapter:
    """Messages output: one `message`, or the named stream events from `message_start` to `message_stop`."""

    def __init__(self, message_id: str, model: str) -> None:
        self.message_id = message_id
        self.model = model
        self.writer = convert.BlockWriter()

    def body(self, events: list[StreamEvent], outcome: Outcome) -> dict[str, Any]:
        return convert.message_response(self.message_id, self.model, events, outcome)

    def opening(self, outcome: Outcome) -> list[str]:
        start: dict[str, Any] = {
            "id": self.message_id,
            "type": "message",
            "role": "assistant",
            "model": self.model,
            "content": [],
            "stop_reason": None,
            "stop_sequence": None,
            "usage": convert.usage(outcome),
        }
        return [sse_event("message_start", {"type": "message_start", "message": start})]

    def frames(self, event: StreamEvent) -> list[str]:
        return [sse_event(name, payload) for name, payload in self.writer.event(event)]

    def failed(self, error: ApiError) -> list[str]:
        return [sse_event("error", anthropic_body(error))]

    def closing(self, outcome: Outcome) -> list[str]:
        out = [sse_event(name, payload) for name, payload in self.writer.close()]
        delta = {
            "stop_reason": convert.stop_reason(outcome, self.writer.has_calls),
            "stop_sequence": outcome.stop_sequence,
        }
        usage = convert.usage(outcome)
        out.append(sse_event("message_delta", {"type": "message_delta", "delta": delta, "usage": usage}))
        out.append(sse_event("message_stop", {"type": "message_stop"}))
        return out


@router.post("/v1/messages/count_tokens", openapi_extra=json_body_doc(CountTokensRequest))
async def count_tokens(request: Request) -> JSONResponse:
    state = server_state(request)
    req = validate(CountTokensRequest, await read_json(request))
    messages, tools, thinking, prefill = convert.count_plan(req, state.options)
    prompt = await pipeline.off_loop(
        build_prompt,
        state.engine.tokenizer,
        messages,
        tools=tools,
        thinking=thinking,
        preserve_thinking=state.options.preserve_thinking,
        prefill=prefill,
    )
    prompt = await pipeline.off_loop(prompt_with_media, state.engine, messages, prompt)  # images' tokens
    return JSONResponse({"input_tokens": len(prompt.token_ids)})
