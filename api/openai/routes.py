"""OpenAI routes: `/v1/models`, `/v1/chat/completions` and the Responses Core routes."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from api import pipeline
from api.body import json_body_doc, read_json, validate
from api.errors import ApiError, openai_body
from api.generation import Outcome
from api.openai import convert, responses
from api.openai.schemas import ChatCompletionRequest, InputTokensRequest, ResponsesRequest
from api.pipeline import Turn
from api.sse import sse_data
from api.state import ServerState, new_id, server_state
from engine.chat.parse import StreamEvent

router = APIRouter()


def _model_card(state: ServerState, name: str) -> dict[str, Any]:
    card: dict[str, Any] = {
        "id": name,
        "object": "model",
        "created": int(state.started_at),
        "owned_by": "ninfer",
        "root": state.engine.model_id,
        "max_model_len": state.max_context,
    }
    if state.synthetic is not None:  # random weights of a real geometry: never pass for the real model
        card["synthetic"] = True
        card["synthetic_geometry"] = state.synthetic
    return card


@router.get("/v1/models")
async def list_models(request: Request) -> JSONResponse:
    state = server_state(request)
    return JSONResponse({"object": "list", "data": [_model_card(state, state.served_model_id)]})


@router.get("/v1/models/{model_id:path}")
async def get_model(request: Request, model_id: str) -> JSONResponse:
    state = server_state(request)
    state.check_model(model_id)
    return JSONResponse(_model_card(state, model_id))


# ------------------------------------------------------------------------------------ chat completions


@router.post("/v1/chat/completions", openapi_extra=json_body_doc(ChatCompletionRequest))
async def chat_completions(request: Request) -> Any:
    state = server_state(request)
    req = validate(ChatCompletionRequest, await read_json(request))
    state.check_model(req.model)
    plan = convert.chat_plan(req, state.options)
    model = req.model or state.served_model_id
    turn = Turn.from_plan(plan, protocol="chat.completions", stream=req.stream, log_fields={"model": model})
    include_usage = bool((req.stream_options or {}).get("include_usage"))
    adapter = ChatAdapter(new_id("chatcmpl-"), model, include_usage, legacy=plan.legacy_functions)
    return await pipeline.run(state, request, turn, adapter)


class ChatAdapter:
    """Chat Completions output: one `chat.completion`, or `chat.completion.chunk` frames ending `[DONE]`."""

    def __init__(self, completion_id: str, model: str, include_usage: bool, *, legacy: bool = False) -> None:
        self.completion_id = completion_id
        self.model = model
        self.include_usage = include_usage
        self.legacy = legacy  # the request used the legacy `functions`
        self.writer = convert.ChunkWriter(completion_id, model, legacy=legacy)
        self.outcome: Outcome | None = None  # the generation's (filled as it runs): streamed logprobs

    def body(self, events: list[StreamEvent], outcome: Outcome) -> dict[str, Any]:
        return convert.chat_response(self.completion_id, self.model, events, outcome, legacy=self.legacy)

    def body_many(self, choices: list[tuple[list[StreamEvent], Outcome]]) -> dict[str, Any]:
        return convert.chat_response_many(self.completion_id, self.model, choices)

    def opening(self, outcome: Outcome) -> list[str]:
        self.outcome = outcome
        return [sse_data(self.writer.chunk({"role": "assistant", "content": ""}))]

    def frames(self, event: StreamEvent) -> list[str]:
        return [sse_data(self.writer.with_logprobs(self.writer.event(event), self.outcome))]

    def failed(self, error: ApiError) -> list[str]:
        return [sse_data(openai_body(error)), "data: [DONE]\n\n"]

    def closing(self, outcome: Outcome) -> list[str]:
        return [*self.choice_closing(outcome), *self.closing_many([outcome])]

    # n > 1 streamed: every choice streams through its own adapter (`choice`), chunks carrying its index,
    # and ends with its own finish reason; the usage of all choices and the terminator come last.

    def choice(self, index: int) -> ChatAdapter:
        adapter = ChatAdapter(self.completion_id, self.model, False, legacy=self.legacy)
        adapter.writer = convert.ChunkWriter(
            self.completion_id, self.model, legacy=self.legacy, index=index, created=self.writer.created
        )
        return adapter

    def choice_closing(self, outcome: Outcome) -> list[str]:
        writer = self.writer
        last = writer.chunk({}, convert.finish_reason(outcome, writer.num_calls > 0, legacy=self.legacy))
        return [sse_data(writer.with_logprobs(last, outcome))]

    def closing_many(self, outcomes: list[Outcome]) -> list[str]:
        usage = [sse_data(self.writer.usage_chunk(outcomes))] if self.include_usage else []
        return [*usage, "data: [DONE]\n\n"]


# ------------------------------------------------------------------------------------ responses


@router.post("/v1/responses", openapi_extra=json_body_doc(ResponsesRequest))
async def create_response(request: Request) -> Any:
    state = server_state(request)
    req = validate(ResponsesRequest, await read_json(request))
    return await responses.create(state, request, req)


@router.post("/v1/responses/input_tokens", openapi_extra=json_body_doc(InputTokensRequest))
async def response_input_tokens(request: Request) -> JSONResponse:
    state = server_state(request)
    req = validate(InputTokensRequest, await read_json(request))
    state.check_model(req.model)
    count = await pipeline.off_loop(responses.count_input_tokens, state, req)
    return JSONResponse({"object": "response.input_tokens", "input_tokens": count})


@router.post("/v1/responses/compact")
async def compact_response(request: Request) -> JSONResponse:
    raise ApiError(400, "compaction_not_supported", "response compaction is not supported by this server")


@router.get("/v1/responses/{response_id}")
async def get_response(request: Request, response_id: str) -> JSONResponse:
    record = responses.lookup(server_state(request), response_id)
    return JSONResponse(record.response)


@router.delete("/v1/responses/{response_id}")
async def delete_response(request: Request, response_id: str) -> JSONResponse:
    state = server_state(request)
    if not state.store.delete(response_id):
        raise responses.not_found(response_id)
    return JSONResponse({"id": response_id, "object": "response.deleted", "deleted": True})


@router.post("/v1/responses/{response_id}/cancel")
async def cancel_response(request: Request, response_id: str) -> JSONResponse:
    responses.lookup(server_state(request), response_id)
    raise ApiError(
        400, "background_not_supported", "only background responses can be cancelled; this server has none"
    )


@router.get("/v1/responses/{response_id}/input_items")
async def list_input_items(request: Request, response_id: str) -> JSONResponse:
    state = server_state(request)
    record = responses.lookup(state, response_id)
    q = request.query_params
    try:
        limit = int(q.get("limit", "20"))
    except ValueError:
        raise ApiError(400, "invalid_request", "limit must be an integer", param="limit") from None
    if not 1 <= limit <= 100:
        raise ApiError(400, "invalid_request", "limit must be in 1..100", param="limit")
    order = q.get("order", "desc")
    if order not in ("asc", "desc"):
        raise ApiError(400, "invalid_request", "order must be 'asc' or 'desc'", param="order")
    items = list(record.input_items) if order == "asc" else list(reversed(record.input_items))
    after = q.get("after")
    if after is not None:
        ids = [item.get("id") for item in items]
        if after not in ids:
            raise ApiError(400, "invalid_request", f"no input item {after!r} in this response", param="after")
        items = items[ids.index(after) + 1 :]
    page = items[:limit]
    return JSONResponse(
        {
            "object": "list",
            "data": page,
            "first_id": page[0]["id"] if page else None,
            "last_id": page[-1]["id"] if page else None,
            "has_more": len(items) > limit,
        }
    )
