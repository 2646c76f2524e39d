"""OpenAI Responses Core: input items -> chat messages, output items, semantic SSE events, the store.

Input items: `message` (string or typed parts), `reasoning` (raw `reasoning_text` content), `function_call`
and `function_call_output`. Consecutive reasoning / assistant text / function calls fold into one assistant
turn of the chat template. `previous_response_id` prepends the stored record's full item history (inputs
then outputs of every earlier turn; `instructions` are not carried forward), so the new prompt extends the
previous one and the engine's prefix checkpoints are reused.
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from fastapi import Request
from fastapi.responses import Response

from api import pipeline, structured
from api.errors import ApiError, invalid
from api.generation import Outcome
from api.media import prompt_with_media
from api.openai.convert import (
    content_of_parts,
    effort_budget,
    forced_tool,
    text_of_parts,
    thinking_choice,
    tool_choice_mode,
    tool_defs,
)
from api.openai.schemas import InputTokensRequest, ResponsesRequest
from api.openai.store import StoredResponse
from api.pipeline import Turn
from api.prompt import Prompt, build_prompt
from api.sampling import sampling_params, stop_strings
from api.sse import sse_event
from api.state import ServerState
from engine.chat.parse import ContentDelta, ReasoningDelta, StreamEvent, ToolCallEvent
from engine.request import MAX_LOGPROBS
from engine.structured import StructuredSpec


def _id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:24]}"


def not_found(response_id: str) -> ApiError:
    return ApiError(404, "response_not_found", f"no stored response {response_id!r}", param="response_id")


def lookup(state: ServerState, response_id: str) -> StoredResponse:
    record = state.store.get(response_id)
    if record is None:
        raise not_found(response_id)
    return record


# ------------------------------------------------------------------------------------------ input


def input_items(value: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalized copies of the input items, each with an id (for `input_items` listing)."""
    raw = [{"type": "message", "role": "user", "content": value}] if isinstance(value, str) else value
    items = []
    for i, item in enumerate(raw):
        if not isinstance(item, Mapping):
            raise invalid("input items must be objects", param=f"input[{i}]")
        copy = dict(item)
        copy.setdefault("type", "message")
        if "id" not in copy:
            copy["id"] = _id(
                {"message": "msg", "function_call": "fc", "reasoning": "rs"}.get(copy["type"], "item")
            )
        items.append(copy)
    return items


def items_to_messages(items: list[dict[str, Any]], instructions: str | None) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    assistant: dict[str, Any] | None = None

    def open_assistant() -> dict[str, Any]:
        nonlocal assistant
        if assistant is None:
            assistant = {"role": "assistant", "content": ""}
            messages.append(assistant)
        return assistant

    for i, item in enumerate(items):
        where, kind = f"input[{i}]", item.get("type")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "assistant", "system", "developer"):
                raise invalid(
                    f"message role must be user, assistant, system or developer; got {role!r}",
                    param=f"{where}.role",
                )
            if role == "user":  # text, or text and images (api/media.py)
                assistant = None
                messages.append(
                    {"role": role, "content": content_of_parts(item.get("content"), f"{where}.content")}
                )
                continue
            text = text_of_parts(item.get("content"), f"{where}.content")
            if role == "assistant":
                turn = open_assistant()
                turn["content"] += text
            else:
                assistant = None
                messages.append({"role": role, "content": text})
        elif kind == "reasoning":
            parts = item.get("content") or []
            if not isinstance(parts, list):
                raise invalid("reasoning content must be a list of parts", param=f"{where}.content")
            texts = [
                p.get("text", "")
                for p in parts
                if isinstance(p, Mapping) and p.get("type") == "reasoning_text"
            ]
            if not texts:
                raise invalid("a reasoning item needs raw reasoning_text content", param=f"{where}.content")
            turn = open_assistant()
            turn["reasoning_content"] = turn.get("reasoning_content", "") + "".join(texts)
        elif kind == "function_call":
            name, arguments = item.get("name"), item.get("arguments", "{}")
            if not isinstance(name, str) or not isinstance(arguments, str):
                raise invalid("a function_call needs a name and string arguments", param=where)
            try:
                decoded = json.loads(arguments or "{}")
            except json.JSONDecodeError:
                raise invalid(
                    "function_call arguments must be a JSON object", param=f"{where}.arguments"
                ) from None
            if not isinstance(decoded, dict):
                raise invalid("function_call arguments must be a JSON object", param=f"{where}.arguments")
            call = {
                "id": item.get("call_id"),
                "type": "function",
                "function": {"name": name, "arguments": decoded},
            }
            open_assistant().setdefault("tool_calls", []).append(call)
        elif kind == "function_call_output":
            assistant = None
            output = item.get("output")
            messages.append(
                {
                    "role": "tool",
                    "content": text_of_parts(output, f"{where}.output"),
                    "tool_call_id": item.get("call_id"),
                }
            )
        else:
            raise invalid(f"unsupported input item type {kind!r}", param=f"{where}.type")
    if instructions:
        if messages and messages[0]["role"] in ("system", "developer"):
            messages[0] = {"role": "system", "content": f"{instructions}\n\n{messages[0]['content']}"}
        else:
            messages.insert(0, {"role": "system", "content": instructions})
    return messages


def function_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for i, tool in enumerate(tools or ()):
        kind = tool.get("type")
        if kind == "namespace":
            inner = tool.get("tools") or []
            if not isinstance(inner, list) or not all(isinstance(t, Mapping) for t in inner):
                raise invalid("a namespace's tools must be a list of tools", param=f"tools[{i}].tools")
            out.extend(function_tools([dict(t) for t in inner]))
            continue
        if kind != "function":
            raise invalid(
                f"tool type {kind!r} is not supported (function tools only)", param=f"tools[{i}].type"
            )
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise invalid("a function tool needs a name", param=f"tools[{i}].name")
        fn = {k: tool[k] for k in ("name", "description", "parameters") if tool.get(k) is not None}
        out.append({"type": "function", "function": fn})
    return out


@dataclass(frozen=True, slots=True)
class ResponsesPlan:
    items: list[dict[str, Any]]  # this turn's input items (ids assigned)
    history: list[dict[str, Any]]  # earlier turns' items (previous_response_id)
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    thinking: bool
    preserve_thinking: bool


def _plan_prompt(state: ServerState, req: ResponsesRequest | InputTokensRequest) -> ResponsesPlan:
    history: list[dict[str, Any]] = []
    if req.previous_response_id is not None:
        record = state.store.get(req.previous_response_id)
        if record is None:
            raise ApiError(  # 400, as OpenAI answers: the request names something that does not exist
                400,
                "previous_response_not_found",
                f"no stored response {req.previous_response_id!r}",
                param="previous_response_id",
            )
        history = [*record.input_items, *record.output_items]
    items = input_items(req.input)
    if not history and not items:
        raise invalid("input must not be empty", param="input")
    tools = function_tools(req.tools)
    mode = tool_choice_mode(getattr(req, "tool_choice", None))
    effort = (req.reasoning or {}).get("effort")
    thinking, preserve = thinking_choice(
        state.options,
        enable=getattr(req, "enable_thinking", None),
        preserve=getattr(req, "preserve_thinking", None),
        kwargs=getattr(req, "chat_template_kwargs", None),
        effort=effort,
    )
    messages = items_to_messages(history + items, req.instructions)
    rendered = tools if tools and mode != "none" else None
    return ResponsesPlan(items, history, messages, rendered, thinking, preserve)


def _prompt(state: ServerState, plan: ResponsesPlan) -> Prompt:
    return build_prompt(
        state.engine.tokenizer,
        plan.messages,
        tools=plan.tools,
        thinking=plan.thinking,
        preserve_thinking=plan.preserve_thinking,
        param="input",
    )


def count_input_tokens(state: ServerState, req: InputTokensRequest) -> int:
    plan = _plan_prompt(state, req)
    return len(prompt_with_media(state.engine, plan.messages, _prompt(state, plan)).token_ids)


def _refuse_unsupported(req: ResponsesRequest) -> None:
    if req.background:
        raise invalid("background responses are not supported", param="background")


def _flat_tools(tools: list[dict[str, Any]] | None) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools or ():
        out.extend(_flat_tools(list(tool.get("tools") or ())) if tool.get("type") == "namespace" else [tool])
    return out


def output_spec(req: ResponsesRequest, plan: ResponsesPlan) -> StructuredSpec | None:
    """The grammar for `text.format`, strict tools, a forced tool_choice, `parallel_tool_calls=false`."""
    mode = tool_choice_mode(req.tool_choice)
    calls = None
    if plan.tools:
        forced = forced_tool(req.tool_choice) if mode in ("required", "function") else None
        parallel = req.parallel_tool_calls is not False
        calls = structured.tools_spec(tool_defs(_flat_tools(req.tools)), forced=forced, parallel=parallel)
    elif mode in ("required", "function"):
        raise invalid("tool_choice requires tools", param="tool_choice")
    fmt = structured.json_format((req.text or {}).get("format"), "text.format")
    return structured.pick(calls if calls is not None and calls.trigger is None else None, fmt, calls)


# ------------------------------------------------------------------------------------------ output


def usage(outcome: Outcome) -> dict[str, Any]:
    return {
        "input_tokens": outcome.prompt_tokens,
        "input_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "output_tokens": outcome.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": outcome.reasoning_tokens},
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
    }


class ResponseBuilder:
    """Output items and the semantic event stream of one response (monotonic `sequence_number`)."""

    def __init__(self, state: ServerState, req: ResponsesRequest) -> None:
        self.id = _id("resp")
        self.req = req
        self.model = req.model or state.served_model_id
        self.created_at = int(time.time())
        self.output: list[dict[str, Any]] = []
        self.sequence = 0
        self._open: dict[str, Any] | None = None  # the item being streamed (reasoning or message)
        self.outcome: Outcome | None = None  # streamed: the generation's, whose logprobs grow as it runs
        self._num_logprobs = 0  # entries of `outcome.logprobs` already given to a message

    def snapshot(self, status: str, outcome: Outcome | None = None) -> dict[str, Any]:
        req = self.req
        incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
        return {
            "id": self.id,
            "object": "response",
            "created_at": self.created_at,
            "status": status,
            "model": self.model,
            "output": self.output if status != "in_progress" else [],
            "error": None,
            "incomplete_details": incomplete,
            "instructions": req.instructions,
            "max_output_tokens": req.max_output_tokens,
            "metadata": req.metadata or {},
            "parallel_tool_calls": True,
            "previous_response_id": req.previous_response_id,
            "reasoning": req.reasoning or {"effort": None, "summary": None},
            "store": req.store,
            "temperature": req.temperature,
            "text": req.text or {"format": {"type": "text"}},
            "tool_choice": req.tool_choice or "auto",
            "tools": req.tools or [],
            "top_p": req.top_p,
            "top_logprobs": req.top_logprobs,
            "truncation": req.truncation or "disabled",
            "usage": None if outcome is None else usage(outcome),
            "user": req.user,
        }

    def _event(self, kind: str, **fields: Any) -> tuple[str, dict[str, Any]]:
        payload = {"type": kind, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return kind, payload

    def start(self) -> list[tuple[str, dict[str, Any]]]:
        return [
            self._event("response.created", response=self.snapshot("in_progress")),
            self._event("response.in_progress", response=self.snapshot("in_progress")),
        ]

    def _open_item(self, kind: str) -> list[tuple[str, dict[str, Any]]]:
        out = self.close_item()
        if kind == "reasoning":
            item: dict[str, Any] = {
                "id": _id("rs"),
                "type": "reasoning",
                "summary": [],
                "content": [],
                "status": "in_progress",
            }
            part: dict[str, Any] = {"type": "reasoning_text", "text": ""}
        else:
            item = {
                "id": _id("msg"),
                "type": "message",
                "role": "assistant",
                "status": "in_progress",
                "content": [],
            }
            part = {"type": "output_text", "text": "", "annotations": [], "logprobs": []}
        index = len(self.output)
        self.output.append(item)
        self._open = item
        out.append(
            self._event("response.output_item.added", output_index=index, item=json.loads(json.dumps(item)))
        )
        item["content"].append(part)
        out.append(
            self._event(
                "response.content_part.added",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            )
        )
        return out

    def close_item(self) -> list[tuple[str, dict[str, Any]]]:
        item, self._open = self._open, None
        if item is None:
            return []
        index = len(self.output) - 1
        part = item["content"][0]
        item["status"] = "completed"
        done = "response.reasoning_text.done" if item["type"] == "reasoning" else "response.output_text.done"
        extra: dict[str, Any] = {}
        if item["type"] == "message":
            part["logprobs"].extend(self._new_logprobs())
            extra["logprobs"] = [_event_logprob(e) for e in part["logprobs"]]
        return [
            self._event(
                done, item_id=item["id"], output_index=index, content_index=0, text=part["text"], **extra
            ),
            self._event(
                "response.content_part.done",
                item_id=item["id"],
                output_index=index,
                content_index=0,
                part=dict(part),
            ),
            self._event("response.output_item.done", output_index=index, item=item),
        ]

    def event(self, event: StreamEvent) -> list[tuple[str, dict[str, Any]]]:
        if isinstance(event, ReasoningDelta | ContentDelta):
            kind = "reasoning" if isinstance(event, ReasoningDelta) else "message"
            out = [] if self._open is not None and self._open["type"] == kind else self._open_item(kind)
            item = self._open
            assert item is not None
            item["content"][0]["text"] += event.text
            index = len(self.output) - 1
            if kind == "reasoning":
                out.append(
                    self._event(
                        "response.reasoning_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=event.text,
                    )
                )
            else:
                out.append(
                    self._event(
                        "response.output_text.delta",
                        item_id=item["id"],
                        output_index=index,
                        content_index=0,
                        delta=event.text,
                        logprobs=[_event_logprob(e) for e in self._take_logprobs(item)],
                    )
                )
            return out
        assert isinstance(event, ToolCallEvent)
        out = self.close_item()
        call = event.call
        item = {
            "id": _id("fc"),
            "type": "function_call",
            "call_id": _id("call"),
            "name": call.name,
            "arguments": "",
            "status": "in_progress",
        }
        index = len(self.output)
        self.output.append(item)
        out.append(self._event("response.output_item.added", output_index=index, item=dict(item)))
        arguments = call.arguments_json
        out.append(
            self._event(
                "response.function_call_arguments.delta",
                item_id=item["id"],
                output_index=index,
                delta=arguments,
            )
        )
        out.append(
            self._event(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                arguments=arguments,
                name=call.name,
            )
        )
        # A call the output limit cut: its arguments as far as they arrived, and the item is incomplete.
        status = "completed" if call.partial_json is None else "incomplete"
        item["arguments"], item["status"] = arguments, status
        out.append(self._event("response.output_item.done", output_index=index, item=item))
        return out

    def _new_logprobs(self) -> list[dict[str, Any]]:
        """The answer tokens' logprob entries not yet given to a message (when the request asked for them)."""
        found = None if self.outcome is None else self.outcome.logprobs
        if not found or len(found) <= self._num_logprobs:
            return []
        new = found[self._num_logprobs :]
        self._num_logprobs = len(found)
        return new

    def _take_logprobs(self, item: dict[str, Any]) -> list[dict[str, Any]]:
        new = self._new_logprobs()
        item["content"][0]["logprobs"].extend(new)
        return new

    def finish(self, outcome: Outcome) -> tuple[str, dict[str, Any]]:
        """All open items closed; then exactly one terminal event (`response.completed` / `.incomplete`)."""
        status = "incomplete" if outcome.finish in ("length", "context") else "completed"
        messages = [item for item in self.output if item.get("type") == "message"]
        if outcome.logprobs is not None and messages:  # `include: ["message.output_text.logprobs"]`
            messages[-1]["content"][0]["logprobs"] = outcome.logprobs
        final = self.snapshot(status, outcome)
        return self._event(f"response.{status}", response=final)

    def failed(self, error: ApiError) -> tuple[str, dict[str, Any]]:
        final = self.snapshot("failed")
        final["error"] = {"code": error.code, "message": error.message}
        return self._event("response.failed", response=final)


def _event_logprob(entry: dict[str, Any]) -> dict[str, Any]:
    """A streamed text event's logprob (the SDK's `ResponseTextDeltaEvent.Logprob`: no bytes)."""
    top = [{"token": t["token"], "logprob": t["logprob"]} for t in entry.get("top_logprobs", ())]
    return {"token": entry["token"], "logprob": entry["logprob"], "top_logprobs": top}


# ------------------------------------------------------------------------------------------ the route


async def create(state: ServerState, request: Request, req: ResponsesRequest) -> Response:
    state.check_model(req.model)
    _refuse_unsupported(req)
    plan = _plan_prompt(state, req)
    max_tokens = req.max_output_tokens or state.options.default_max_tokens
    params = sampling_params(
        req, max_tokens=max_tokens, stop=stop_strings(req.stop), names={"max_tokens": "max_output_tokens"}
    )
    budget = effort_budget((req.reasoning or {}).get("effort"), "reasoning.effort")
    wants = "message.output_text.logprobs" in (req.include or ())
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise invalid(f"top_logprobs must be in [0, {MAX_LOGPROBS}]", param="top_logprobs")
    logprobs = (req.top_logprobs or 0) if wants else None
    params = replace(params, structured=output_spec(req, plan), logprobs=logprobs)
    turn = Turn.from_plan(
        plan,
        protocol="openai.responses",
        stream=req.stream,
        params=params,
        max_tokens=max_tokens,
        prompt_param="input",
        thinking_budget=budget,
        log_fields={"model": req.model, "continued": req.previous_response_id is not None},
    )
    return await pipeline.run(state, request, turn, ResponsesAdapter(state, req, plan))


class ResponsesAdapter:
    """Responses output: the final response object, or the semantic events; a finished response is stored."""

    def __init__(self, state: ServerState, req: ResponsesRequest, plan: ResponsesPlan) -> None:
        self.state = state
        self.req = req
        self.plan = plan
        self.builder = ResponseBuilder(state, req)

    def _finish(self, outcome: Outcome) -> tuple[str, dict[str, Any]]:
        name, payload = self.builder.finish(outcome)
        if self.req.store:
            response = payload["response"]
            self.state.store.put(response, self.plan.history + self.plan.items, list(response["output"]))
        return name, payload

    def body(self, events: list[StreamEvent], outcome: Outcome) -> dict[str, Any]:
        for event in events:
            self.builder.event(event)
        self.builder.close_item()
        response: dict[str, Any] = self._finish(outcome)[1]["response"]
        return response

    def opening(self, outcome: Outcome) -> list[str]:
        self.builder.outcome = outcome  # the text deltas carry the logprobs of their tokens
        return [sse_event(name, payload) for name, payload in self.builder.start()]

    def frames(self, event: StreamEvent) -> list[str]:
        return [sse_event(name, payload) for name, payload in self.builder.event(event)]

    def failed(self, error: ApiError) -> list[str]:
        return [sse_event(*self.builder.failed(error))]

    def closing(self, outcome: Outcome) -> list[str]:
        out = [sse_event(name, payload) for name, payload in self.builder.close_item()]
        return [*out, sse_event(*self._finish(outcome))]
