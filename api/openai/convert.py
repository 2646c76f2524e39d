"""OpenAI Chat Completions <-> the chat template's messages and the parsed generation.

Requests: roles system/developer/user/assistant/tool (and legacy `function`), text/refusal parts,
assistant `reasoning_content`/`reasoning` history and `tool_calls` (or a legacy `function_call`), function
tools with tool_choice auto/none/allowed_tools; the legacy `functions` / `function_call` are the same tools
and choice (`{"name": F}` is the named choice). `reasoning_effort` picks thinking on/off and the tier's
thinking budget (engine.sampling). Everything the server cannot honour is a 400 naming the field.
Responses: `reasoning_content` for reasoning, `tool_calls` with `call_…` ids, usage with cached tokens.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from api import structured
from api.errors import ApiError, invalid
from api.generation import Outcome
from api.media import template_part
from api.openai.schemas import ChatCompletionRequest
from api.options import ServerOptions
from api.sampling import sampling_params, stop_strings
from engine.chat.parse import ContentDelta, ReasoningDelta, StreamEvent, ToolCall, ToolCallEvent
from engine.request import MAX_LOGPROBS, SamplingParams
from engine.sampling import effort_thinking
from engine.structured import StructuredSpec, ToolDef

MAX_CHOICES = 8  # Chat `n`
_ROLES = ("system", "developer", "user", "assistant", "tool", "function")


@dataclass(frozen=True, slots=True)
class ChatPlan:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None  # rendered into the prompt
    parse_tools: list[dict[str, Any]] | None  # tool calls are parsed only against these
    thinking: bool
    preserve_thinking: bool
    params: SamplingParams
    max_tokens: int
    n: int = 1
    legacy_functions: bool = False  # the request used `functions`: answer with `function_call`


def call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def text_of_parts(content: Any, param: str, *, allow_refusal: bool = True) -> str:
    """The text of a string or a list of text parts; media parts are refused (no vision in this build)."""
    if content is None or isinstance(content, str):
        return content or ""
    if not isinstance(content, list):
        raise invalid("content must be a string or a list of parts", param=param)
    texts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, Mapping):
            raise invalid("content parts must be objects", param=where)
        kind = part.get("type")
        if kind in ("text", "input_text", "output_text") and isinstance(part.get("text"), str):
            texts.append(part["text"])
        elif kind == "refusal" and allow_refusal and isinstance(part.get("refusal"), str):
            texts.append(part["refusal"])
        elif kind in (
            "image_url",
            "input_image",
            "video_url",
            "input_video",
            "input_audio",
            "file",
            "input_file",
        ):
            raise ApiError(
                400, "vision_disabled", f"{kind} parts are not supported by this server", param=where
            )
        else:
            raise invalid(f"unsupported content part type {kind!r}", param=f"{where}.type")
    return "".join(texts)


_MEDIA_PARTS = {"image_url": "image", "input_image": "image", "video_url": "video", "input_video": "video"}


def content_of_parts(content: Any, param: str) -> str | list[dict[str, Any]]:
    """A user message's content: its text, or (with images / video) the template's list of text and media parts
    (api/media.py; the server refuses them later without --vision)."""
    if not isinstance(content, list) or not any(
        isinstance(p, Mapping) and p.get("type") in _MEDIA_PARTS for p in content
    ):
        return text_of_parts(content, param)
    parts: list[dict[str, Any]] = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        kind = part.get("type") if isinstance(part, Mapping) else None
        if kind not in _MEDIA_PARTS:
            parts.append({"type": "text", "text": text_of_parts([part], param)})
            continue
        source = part.get(kind)
        if kind == "input_image":  # Responses: image_url is the URL string itself
            source = part.get("image_url")
            if source is None and part.get("file_id") is not None:
                raise invalid(
                    "input_image.file_id is not supported: send image_url", param=f"{where}.file_id"
                )
        url = source.get("url") if isinstance(source, Mapping) else source
        if not isinstance(url, str) or not url:
            raise invalid(f"a {kind} part needs a url", param=where)
        parts.append(template_part(_MEDIA_PARTS[kind], where, url=url))
    return parts


def chat_messages(raw: list[dict[str, Any]]) -> list[dict[str, Any]]:
    messages: list[dict[str, Any]] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}]"
        role = message.get("role")
        if role not in _ROLES:
            raise invalid(f"role must be one of {', '.join(_ROLES)}; got {role!r}", param=f"{where}.role")
        if role == "user":
            content: Any = content_of_parts(message.get("content"), f"{where}.content")
        else:
            content = text_of_parts(message.get("content"), f"{where}.content")
        if role == "function":  # legacy function result
            messages.append({"role": "tool", "content": content, "name": message.get("name")})
            continue
        item: dict[str, Any] = {"role": role, "content": content}
        if role == "assistant":
            reasoning = message.get("reasoning_content", message.get("reasoning"))
            if reasoning is not None:
                if not isinstance(reasoning, str):
                    raise invalid("reasoning_content must be a string", param=f"{where}.reasoning_content")
                item["reasoning_content"] = reasoning
            calls = message.get("tool_calls")
            if calls is not None and not isinstance(calls, list):
                raise invalid("tool_calls must be a list", param=f"{where}.tool_calls")
            legacy = message.get("function_call")
            if not calls and isinstance(legacy, Mapping):
                calls = [{"id": None, "type": "function", "function": legacy}]
            if calls:
                item["tool_calls"] = [
                    _history_call(call, f"{where}.tool_calls[{k}]") for k, call in enumerate(calls)
                ]
        if role == "tool":
            item["tool_call_id"] = message.get("tool_call_id")
        messages.append(item)
    return messages


def _history_call(call: Any, where: str) -> dict[str, Any]:
    fn = call.get("function") if isinstance(call, Mapping) else None
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise invalid("a tool call needs function.name", param=where)
    if not isinstance(call.get("id"), str | None):
        raise invalid("a tool call id must be a string", param=f"{where}.id")
    if not isinstance(fn.get("arguments"), str | Mapping | None):
        raise invalid("function.arguments must be a JSON string", param=f"{where}.function.arguments")
    return {
        "id": call.get("id"),
        "type": "function",
        "function": {"name": fn["name"], "arguments": fn.get("arguments") or "{}"},
    }


def function_tools(tools: list[dict[str, Any]] | None, param: str = "tools") -> list[dict[str, Any]]:
    out = []
    for i, tool in enumerate(tools or ()):
        where = f"{param}[{i}]"
        if tool.get("type") != "function" or not isinstance(tool.get("function"), Mapping):
            raise invalid("only function tools are supported", param=f"{where}.type")
        fn = tool["function"]
        if not isinstance(fn.get("name"), str) or not fn["name"]:
            raise invalid("a function tool needs a name", param=f"{where}.function.name")
        out.append({"type": "function", "function": {k: v for k, v in fn.items() if k != "strict"}})
    return out


def with_legacy_functions(req: ChatCompletionRequest) -> ChatCompletionRequest:
    """`req` with the legacy `functions` / `function_call` spelled as `tools` / `tool_choice`, so everything
    after reads only the current fields (`{"name": F}` becomes the named choice)."""
    if req.functions is None:
        if req.function_call is not None:
            raise invalid("function_call needs functions", param="function_call")
        return req
    if req.tools is not None:
        raise invalid("give tools or the legacy functions, not both", param="functions")
    tools = [{"type": "function", "function": fn} if isinstance(fn, Mapping) else fn for fn in req.functions]
    choice = req.function_call
    if isinstance(choice, Mapping):
        choice = {"type": "function", "function": {"name": choice.get("name")}}
    return req.model_copy(
        update={"tools": tools, "tool_choice": req.tool_choice if choice is None else choice}
    )


def tool_defs(tools: list[dict[str, Any]] | None, param: str = "tools") -> list[ToolDef]:
    """The grammar's view of Chat (`{type, function: {...}}`) or Responses (flat) function tools."""
    defs = []
    for i, tool in enumerate(tools or ()):
        nested = tool.get("function")
        fn: Mapping[str, Any] = nested if isinstance(nested, Mapping) else tool
        where = f"{param}[{i}]" + (".function" if fn is not tool else "")
        defs.append(structured.tool_def(fn.get("name"), fn.get("parameters"), bool(fn.get("strict")), where))
    return defs


def tool_choice_mode(choice: Any, param: str = "tool_choice") -> str:
    """auto | none | required | function (a named function: `forced_tool` gives its name);
    `allowed_tools` is accepted as its mode (auto or required)."""
    if choice is None or choice in ("auto", "none", "required"):
        return str(choice or "auto")
    if isinstance(choice, Mapping) and choice.get("type") == "allowed_tools":
        mode = choice.get("mode", (choice.get("allowed_tools") or {}).get("mode", "auto"))
        return "required" if mode == "required" else "auto"
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        if not isinstance(forced_tool(choice), str):
            raise invalid("a named tool_choice needs the function's name", param=param)
        return "function"
    raise invalid("tool_choice must be auto, none, required or a named function", param=param)


def forced_tool(choice: Any) -> str | None:
    """None (auto), "" (required: some tool) or the name a `{"type": "function", ...}` choice names."""
    if choice == "required" or (
        isinstance(choice, Mapping)
        and choice.get("type") == "allowed_tools"
        and tool_choice_mode(choice) == "required"
    ):
        return ""
    if isinstance(choice, Mapping) and choice.get("type") == "function":
        fn = choice.get("function")
        name = fn.get("name") if isinstance(fn, Mapping) else choice.get("name")
        return name if isinstance(name, str) else None
    return None


def effort_budget(effort: str | None, param: str = "reasoning_effort") -> int | None:
    """The thinking budget of a reasoning-effort tier (None: no tier given); unknown tiers are 400s."""
    if effort is None:
        return None
    try:
        return effort_thinking(effort)[1]
    except ValueError as exc:
        raise invalid(str(exc), param=param) from None


def thinking_choice(
    options: ServerOptions,
    *,
    enable: bool | None,
    preserve: bool | None,
    kwargs: Mapping[str, Any] | None,
    effort: str | None,
) -> tuple[bool, bool]:
    kwargs = kwargs or {}
    thinking = options.thinking
    if effort is not None:
        thinking = effort != "none"
    for value in (kwargs.get("enable_thinking"), enable):
        if value is not None:
            thinking = bool(value)
    keep = options.preserve_thinking
    for value in (kwargs.get("preserve_thinking"), preserve):
        if value is not None:
            keep = bool(value)
    return thinking, keep


def _refuse_unsupported(req: ChatCompletionRequest) -> None:
    if req.n is not None and not 1 <= req.n <= MAX_CHOICES:
        raise invalid(f"n must be in [1, {MAX_CHOICES}]", param="n")
    if req.logit_bias and any(v != 0 for v in req.logit_bias.values()):
        raise invalid("logit_bias is not supported", param="logit_bias")
    if req.top_logprobs is not None and not req.logprobs:
        raise invalid("top_logprobs needs logprobs: true", param="top_logprobs")
    if req.top_logprobs is not None and not 0 <= req.top_logprobs <= MAX_LOGPROBS:
        raise invalid(f"top_logprobs must be in [0, {MAX_LOGPROBS}]", param="top_logprobs")
    if req.audio is not None or (req.modalities and req.modalities != ["text"]):
        raise invalid("audio output is not supported", param="audio")


def chat_plan(req: ChatCompletionRequest, options: ServerOptions) -> ChatPlan:
    req = with_legacy_functions(req)
    _refuse_unsupported(req)
    budget = effort_budget(req.reasoning_effort)
    messages = chat_messages(req.messages)
    tools = function_tools(req.tools)
    mode = tool_choice_mode(req.tool_choice)
    thinking, preserve = thinking_choice(
        options,
        enable=req.enable_thinking,
        preserve=req.preserve_thinking,
        kwargs=req.chat_template_kwargs,
        effort=req.reasoning_effort,
    )
    max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    limit = options.default_max_tokens if max_tokens is None else max_tokens
    names = {"max_tokens": "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"}
    params = sampling_params(req, max_tokens=limit or None, stop=stop_strings(req.stop), names=names)
    if budget is not None:
        params = replace(params, thinking_budget=budget)
    rendered = tools if tools and mode != "none" else None
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = replace(params, structured=output_spec(req, rendered, mode), logprobs=logprobs)
    params = replace(params, ignore_eos=req.ignore_eos)
    legacy = req.functions is not None
    return ChatPlan(messages, rendered, rendered, thinking, preserve, params, limit, req.n or 1, legacy)


def output_spec(
    req: ChatCompletionRequest, tools: list[dict[str, Any]] | None, mode: str
) -> StructuredSpec | None:
    """The grammar for `response_format`, strict tools, a forced tool_choice, `parallel_tool_calls=false`."""
    calls = None
    if tools:
        forced = forced_tool(req.tool_choice) if mode in ("required", "function") else None
        parallel = req.parallel_tool_calls is not False
        calls = structured.tools_spec(tool_defs(req.tools), forced=forced, parallel=parallel)
    elif mode in ("required", "function"):
        raise invalid("tool_choice requires tools", param="tool_choice")
    fmt = structured.json_format(req.response_format, "response_format", schema_key="json_schema")
    forcing = calls if calls is not None and calls.trigger is None else None
    return structured.pick(forcing, fmt, calls)


# ------------------------------------------------------------------------------------------- output


def usage(outcome: Outcome) -> dict[str, Any]:
    return {
        "prompt_tokens": outcome.prompt_tokens,
        "completion_tokens": outcome.completion_tokens,
        "total_tokens": outcome.prompt_tokens + outcome.completion_tokens,
        "prompt_tokens_details": {"cached_tokens": outcome.cached_tokens},
        "completion_tokens_details": {"reasoning_tokens": outcome.reasoning_tokens},
    }


def finish_reason(outcome: Outcome, has_calls: bool, *, legacy: bool = False) -> str:
    if outcome.finish in ("length", "context"):
        return "length"
    if has_calls:
        return "function_call" if legacy else "tool_calls"
    return "stop"


def legacy_call_json(call: ToolCall) -> dict[str, Any]:
    """A call in the legacy `function_call` shape (one per message: the first call when there are more)."""
    return {"name": call.name, "arguments": call.arguments_json}


def tool_call_json(call: ToolCall, cid: str) -> dict[str, Any]:
    return {"id": cid, "type": "function", "function": {"name": call.name, "arguments": call.arguments_json}}


def chat_response_many(
    completion_id: str, model: str, choices: list[tuple[list[StreamEvent], Outcome]]
) -> dict[str, Any]:
    """n choices of one prompt: usage counts the prompt once and every choice's completion."""
    bodies = [chat_response(completion_id, model, events, outcome) for events, outcome in choices]
    body = bodies[0]
    body["choices"] = [dict(b["choices"][0], index=i) for i, b in enumerate(bodies)]
    body["usage"] = usage_many([outcome for _, outcome in choices])
    return body


def usage_many(outcomes: Sequence[Outcome]) -> dict[str, Any]:
    """The usage of n choices of one prompt: the prompt once, every choice's completion."""
    total = usage(outcomes[0])
    completion = sum(o.completion_tokens for o in outcomes)
    total["completion_tokens"] = completion
    total["total_tokens"] = outcomes[0].prompt_tokens + completion
    total["completion_tokens_details"]["reasoning_tokens"] = sum(o.reasoning_tokens for o in outcomes)
    return total


def chat_response(
    completion_id: str, model: str, events: list[StreamEvent], outcome: Outcome, *, legacy: bool = False
) -> dict[str, Any]:
    reasoning = "".join(e.text for e in events if isinstance(e, ReasoningDelta))
    content = "".join(e.text for e in events if isinstance(e, ContentDelta))
    calls = [e.call for e in events if isinstance(e, ToolCallEvent)]
    message: dict[str, Any] = {"role": "assistant", "content": content if content or not calls else None}
    if reasoning:
        message["reasoning_content"] = reasoning
    if calls and legacy:
        message["function_call"] = legacy_call_json(calls[0])
    elif calls:
        message["tool_calls"] = [tool_call_json(c, call_id()) for c in calls]
    return {
        "id": completion_id,
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": message,
                "finish_reason": finish_reason(outcome, bool(calls), legacy=legacy),
                "logprobs": None
                if outcome.logprobs is None
                else {"content": outcome.logprobs, "refusal": None},
            }
        ],
        "usage": usage(outcome),
    }


class ChunkWriter:
    """Builds `chat.completion.chunk` payloads for one streamed choice (`index`) of a completion."""

    def __init__(
        self,
        completion_id: str,
        model: str,
        *,
        legacy: bool = False,
        index: int = 0,
        created: int | None = None,
    ) -> None:
        self.completion_id = completion_id
        self.model = model
        self.legacy = legacy  # calls as the legacy `function_call` delta (the first one only)
        self.index = index  # the choice (`n` > 1 streams each choice's chunks with its index)
        self.created = int(time.time()) if created is None else created
        self.num_calls = 0
        self.num_logprobs = 0  # entries of `Outcome.logprobs` already streamed

    def with_logprobs(self, chunk: dict[str, Any], outcome: Outcome | None) -> dict[str, Any]:
        """Attach the answer tokens' logprobs not yet sent (when the request asked for them)."""
        if outcome is not None and outcome.logprobs is not None and len(outcome.logprobs) > self.num_logprobs:
            new = outcome.logprobs[self.num_logprobs :]
            self.num_logprobs = len(outcome.logprobs)
            chunk["choices"][0]["logprobs"] = {"content": new, "refusal": None}
        return chunk

    def chunk(self, delta: dict[str, Any], finish: str | None = None) -> dict[str, Any]:
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [{"index": self.index, "delta": delta, "finish_reason": finish, "logprobs": None}],
        }

    def event(self, event: StreamEvent) -> dict[str, Any]:
        if isinstance(event, ReasoningDelta):
            return self.chunk({"reasoning_content": event.text})
        if isinstance(event, ContentDelta):
            return self.chunk({"content": event.text})
        self.num_calls += 1
        if self.legacy:
            return self.chunk({"function_call": legacy_call_json(event.call)} if self.num_calls == 1 else {})
        call = tool_call_json(event.call, call_id())
        call["index"] = self.num_calls - 1
        return self.chunk({"tool_calls": [call]})

    def usage_chunk(self, outcome: Outcome | Sequence[Outcome]) -> dict[str, Any]:
        """The final usage chunk (no choices): of one choice, or of all n choices."""
        return {
            "id": self.completion_id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
            "choices": [],
            "usage": usage(outcome) if isinstance(outcome, Outcome) else usage_many(outcome),
        }
