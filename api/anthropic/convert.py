"""Anthropic Messages <-> the chat template's messages and the parsed generation.

Input: system text (a first block starting `x-anthropic-billing-header:` is dropped), text blocks,
thinking history (signatures are opaque), tool_use / tool_result (results are put in call order and
`is_error` is rendered), a final text-only assistant message as a prefill. Output: thinking, text and
tool_use blocks; usage splits the prompt into `input_tokens` + `cache_read_input_tokens`.

Thinking follows the Messages API: off unless the request enables it (`thinking` missing means off on this
route, whatever the server's default), so `content[0]` is the answer. `enabled` carries `budget_tokens`,
which the engine enforces (`SamplingParams.thinking_budget`); `adaptive` sets no budget of its own.
Message threads (the `thread` field of the `message-threads` beta, which the SDK's tool runner sends) are
not kept by this server: such a request gets the API's own `thread_unsupported_request` refusal, on which
the SDK resends the whole conversation without a thread.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from api import structured
from api.anthropic.schemas import CountTokensRequest, MessagesRequest
from api.errors import ApiError, invalid
from api.generation import Outcome
from api.media import decode_base64, template_part
from api.options import ServerOptions
from api.sampling import sampling_params, stop_strings
from engine.chat.parse import ContentDelta, ReasoningDelta, StreamEvent, ToolCallEvent
from engine.request import SamplingParams
from engine.structured import StructuredSpec

BILLING_HEADER = "x-anthropic-billing-header:"
MEDIA_BLOCKS = ("image", "document", "search_result", "container_upload")


@dataclass(frozen=True, slots=True)
class MessagesPlan:
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    thinking: bool
    prefill: bool
    params: SamplingParams
    max_tokens: int
    thinking_budget: int | None = None  # `thinking.budget_tokens`, enforced by `Generation`


def tool_use_id() -> str:
    return f"toolu_{uuid.uuid4().hex[:24]}"


def system_text(system: str | list[dict[str, Any]] | None) -> str:
    if system is None or isinstance(system, str):
        return system or ""
    texts = []
    for i, block in enumerate(system):
        if block.get("type") != "text" or not isinstance(block.get("text"), str):
            raise invalid("system blocks must be text blocks", param=f"system[{i}]")
        if i == 0 and block["text"].startswith(BILLING_HEADER):
            continue
        texts.append(block["text"])
    return "\n\n".join(texts)


def _block_text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if content is None:
        return ""
    if not isinstance(content, list):
        raise invalid("content must be a string or a list of blocks", param=where)
    texts = []
    for j, block in enumerate(content):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind in MEDIA_BLOCKS:
            raise ApiError(
                400,
                "vision_disabled",
                f"{kind} blocks are not supported by this server",
                param=f"{where}[{j}]",
            )
        else:
            raise invalid(f"unsupported block type {kind!r}", param=f"{where}[{j}].type")
    return "".join(texts)


def image_part(block: Mapping[str, Any], where: str) -> dict[str, Any]:
    """An ``image`` block (``source``: base64 data, or a URL) as the template's media part (api/media.py)."""
    source = block.get("source")
    kind = source.get("type") if isinstance(source, Mapping) else None
    if kind == "base64" and isinstance(source.get("data"), str):  # type: ignore[union-attr]
        return template_part("image", where, data=decode_base64(source["data"], f"{where}.source.data"))  # type: ignore[index]
    if kind == "url" and isinstance(source.get("url"), str):  # type: ignore[union-attr]
        return template_part("image", where, url=source["url"])  # type: ignore[index]
    raise invalid(
        "an image block needs source {type: base64, data} or {type: url, url}", param=f"{where}.source"
    )


def _user_turn(blocks: list[Any], where: str, call_order: list[str]) -> list[dict[str, Any]]:
    results: dict[str, dict[str, Any]] = {}
    unordered: list[dict[str, Any]] = []
    texts: list[str] = []
    parts: list[dict[str, Any]] = []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "tool_result":
            if not isinstance(block.get("tool_use_id"), str | None):
                raise invalid("tool_use_id must be a string", param=f"{where}[{j}].tool_use_id")
            text = _block_text(block.get("content"), f"{where}[{j}].content")
            if block.get("is_error"):
                text = f"Error: {text}"
            item = {"role": "tool", "content": text, "tool_call_id": block.get("tool_use_id")}
            if block.get("tool_use_id") in call_order:
                results[block["tool_use_id"]] = item
            else:
                unordered.append(item)
        elif kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
            parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append(image_part(block, f"{where}[{j}]"))
        elif kind in MEDIA_BLOCKS:
            raise ApiError(
                400,
                "vision_disabled",
                f"{kind} blocks are not supported by this server",
                param=f"{where}[{j}]",
            )
        else:
            raise invalid(f"unsupported user block type {kind!r}", param=f"{where}[{j}].type")
    turn = [results[cid] for cid in call_order if cid in results] + unordered
    if len(parts) > len(texts):  # images: the template's list of parts (api/media.py)
        turn.append({"role": "user", "content": parts})
    elif texts or not turn:
        turn.append({"role": "user", "content": "".join(texts)})
    return turn


def _assistant_turn(blocks: list[Any], where: str) -> dict[str, Any]:
    reasoning, texts, calls = [], [], []
    for j, block in enumerate(blocks):
        kind = block.get("type") if isinstance(block, Mapping) else None
        if kind == "thinking":
            reasoning.append(str(block.get("thinking", "")))
        elif kind == "redacted_thinking":
            continue
        elif kind == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif kind == "tool_use":
            if not isinstance(block.get("name"), str) or not isinstance(block.get("input", {}), Mapping):
                raise invalid("tool_use needs a name and an object input", param=f"{where}[{j}]")
            if not isinstance(block.get("id"), str | None):
                raise invalid("tool_use id must be a string", param=f"{where}[{j}].id")
            calls.append(
                {
                    "id": block.get("id"),
                    "type": "function",
                    "function": {"name": block["name"], "arguments": dict(block.get("input") or {})},
                }
            )
        else:
            raise invalid(f"unsupported assistant block type {kind!r}", param=f"{where}[{j}].type")
    item: dict[str, Any] = {"role": "assistant", "content": "".join(texts)}
    if reasoning:
        item["reasoning_content"] = "\n".join(reasoning)
    if calls:
        item["tool_calls"] = calls
    return item


def chat_messages(
    system: str | list[dict[str, Any]] | None, raw: list[dict[str, Any]]
) -> tuple[list[dict[str, Any]], bool]:
    """(template messages, prefill): the last message is an assistant text to continue."""
    messages: list[dict[str, Any]] = []
    text = system_text(system)
    if text:
        messages.append({"role": "system", "content": text})
    call_order: list[str] = []
    for i, message in enumerate(raw):
        where = f"messages[{i}].content"
        role, content = message.get("role"), message.get("content")
        blocks = [{"type": "text", "text": content}] if isinstance(content, str) else content
        if not isinstance(blocks, list):
            raise invalid("content must be a string or a list of blocks", param=where)
        if role == "user":
            messages.extend(_user_turn(blocks, where, call_order))
            call_order = []
        elif role == "assistant":
            item = _assistant_turn(blocks, where)
            call_order = [c["id"] for c in item.get("tool_calls", ())]
            messages.append(item)
        else:
            raise invalid(f"role must be 'user' or 'assistant'; got {role!r}", param=f"messages[{i}].role")
    prefill = messages[-1]["role"] == "assistant"
    if prefill and (messages[-1].get("tool_calls") or not messages[-1]["content"]):
        raise invalid("a final assistant message must be non-empty text only (a prefill)", param="messages")
    return messages, prefill


def anthropic_tools(
    tools: list[dict[str, Any]] | None, choice: dict[str, Any] | None
) -> list[dict[str, Any]] | None:
    kind = (choice or {}).get("type", "auto")
    if kind not in ("auto", "none", "any", "tool"):
        raise invalid("tool_choice.type must be auto, any, tool or none", param="tool_choice.type")
    out = []
    for i, tool in enumerate(tools or ()):
        if tool.get("type") not in (None, "custom"):
            raise invalid(f"server tool {tool.get('type')!r} is not supported", param=f"tools[{i}].type")
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise invalid("a tool needs a name", param=f"tools[{i}].name")
        fn = {
            "name": tool["name"],
            "description": tool.get("description", ""),
            "parameters": tool.get("input_schema") or {},
        }
        out.append({"type": "function", "function": fn})
    return out if out and kind != "none" else None


def output_spec(req: MessagesRequest, tools: list[dict[str, Any]] | None) -> StructuredSpec | None:
    """The grammar for `output_config.format` (or the beta `output_format`), strict tools and the forcing
    tool choices (`any`, `tool`), `disable_parallel_tool_use`."""
    choice = req.tool_choice or {}
    kind = choice.get("type", "auto")
    calls = None
    if tools:
        forced = "" if kind == "any" else choice.get("name") if kind == "tool" else None
        if kind == "tool" and not isinstance(forced, str):
            raise invalid("tool_choice of type tool needs a name", param="tool_choice.name")
        defs = [
            structured.tool_def(t.get("name"), t.get("input_schema"), bool(t.get("strict")), f"tools[{i}]")
            for i, t in enumerate(req.tools or ())
        ]
        parallel = not choice.get("disable_parallel_tool_use", False)
        calls = structured.tools_spec(defs, forced=forced, parallel=parallel)
    elif kind in ("any", "tool"):
        raise invalid(f"tool_choice {kind!r} requires tools", param="tool_choice.type")
    extra = req.model_extra or {}
    config = extra.get("output_config")
    fmt, where = (config.get("format"), "output_config.format") if isinstance(config, dict) else (None, "")
    if fmt is None and extra.get("output_format") is not None:
        fmt, where = extra["output_format"], "output_format"
    if isinstance(fmt, dict) and fmt.get("type") == "json_schema":
        fmt = {**fmt, "strict": True}  # Anthropic's structured outputs always hold the schema
    spec = structured.json_format(fmt, where) if fmt is not None else None
    return structured.pick(calls if calls is not None and calls.trigger is None else None, spec, calls)


def thinking_mode(thinking: dict[str, Any] | None, max_tokens: int, options: ServerOptions) -> bool:
    if thinking is None:
        return False  # the Messages API thinks only when asked
    kind = thinking.get("type")
    if thinking.get("display") == "omitted":
        raise invalid("thinking.display 'omitted' is not supported", param="thinking.display")
    if kind == "disabled":
        return False
    if kind == "adaptive":
        return True
    if kind == "enabled":
        budget = thinking.get("budget_tokens")
        if not isinstance(budget, int) or budget < 1024:
            raise invalid("thinking.budget_tokens must be an integer >= 1024", param="thinking.budget_tokens")
        if budget >= max_tokens:
            raise invalid(
                "thinking.budget_tokens must be less than max_tokens", param="thinking.budget_tokens"
            )
        return True
    raise invalid("thinking.type must be 'enabled', 'disabled' or 'adaptive'", param="thinking.type")


def refuse_thread(req: MessagesRequest | CountTokensRequest) -> None:
    """A `thread` (message-threads beta) is refused the way the API refuses one it cannot keep."""
    if (req.model_extra or {}).get("thread") is not None:
        raise ApiError(
            400,
            "thread_unsupported_request",
            "this server does not keep message threads; send the full conversation without `thread`",
            param="thread",
            details={"error_code": "thread_unsupported_request"},
        )


def messages_plan(req: MessagesRequest, options: ServerOptions) -> MessagesPlan:
    refuse_thread(req)
    max_tokens = req.max_tokens or options.default_max_tokens
    messages, prefill = chat_messages(req.system, req.messages)
    tools = anthropic_tools(req.tools, req.tool_choice)
    thinking = thinking_mode(req.thinking, max_tokens, options)
    stops = stop_strings(req.stop_sequences, param="stop_sequences")
    params = sampling_params(req, max_tokens=max_tokens, stop=stops)
    params = replace(params, structured=output_spec(req, tools))
    budget = (req.thinking or {}).get("budget_tokens") if thinking else None
    enabled = (req.thinking or {}).get("type") == "enabled"
    return MessagesPlan(
        messages, tools, thinking, prefill, params, max_tokens, budget if enabled and budget else None
    )


def count_plan(
    req: CountTokensRequest, options: ServerOptions
) -> tuple[list[dict[str, Any]], list[dict[str, Any]] | None, bool, bool]:
    messages, prefill = chat_messages(req.system, req.messages)
    tools = anthropic_tools(req.tools, req.tool_choice)
    return messages, tools, thinking_mode(req.thinking, 1 << 30, options), prefill


# ------------------------------------------------------------------------------------------- output


def stop_reason(outcome: Outcome, has_calls: bool) -> str:
    if outcome.finish == "length":
        return "max_tokens"
    if outcome.finish == "context":
        return "model_context_window_exceeded"
    if outcome.stop_sequence is not None:
        return "stop_sequence"
    return "tool_use" if has_calls else "end_turn"


def usage(outcome: Outcome) -> dict[str, Any]:
    return {
        "input_tokens": outcome.prompt_tokens - outcome.cached_tokens,
        "output_tokens": outcome.completion_tokens,
        "cache_read_input_tokens": outcome.cached_tokens,
        "cache_creation_input_tokens": 0,
    }


def message_response(
    message_id: str, model: str, events: list[StreamEvent], outcome: Outcome
) -> dict[str, Any]:
    content: list[dict[str, Any]] = []
    for event in events:
        last = content[-1] if content else None
        if isinstance(event, ReasoningDelta):
            if last is not None and last["type"] == "thinking":
                last["thinking"] += event.text
            else:
                content.append({"type": "thinking", "thinking": event.text, "signature": ""})
        elif isinstance(event, ContentDelta):
            if last is not None and last["type"] == "text":
                last["text"] += event.text
            else:
                content.append({"type": "text", "text": event.text})
        elif isinstance(event, ToolCallEvent):
            content.append(
                {
                    "type": "tool_use",
                    "id": tool_use_id(),
                    "name": event.call.name,
                    "input": event.call.arguments,
                }
            )
    has_calls = any(block["type"] == "tool_use" for block in content)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": stop_reason(outcome, has_calls),
        "stop_sequence": outcome.stop_sequence,
        "usage": usage(outcome),
    }


class BlockWriter:
    """Anthropic stream events for one message: opens and closes content blocks as the kind changes."""

    def __init__(self) -> None:
        self.index = -1
        self.open: str | None = None
        self.has_calls = False

    def _start(self, block: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
        out = self.close()
        self.index += 1
        self.open = block["type"]
        out.append(
            (
                "content_block_start",
                {"type": "content_block_start", "index": self.index, "content_block": block},
            )
        )
        return out

    def close(self) -> list[tuple[str, dict[str, Any]]]:
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            delta = {"type": "signature_delta", "signature": ""}
            out.append(
                ("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})
            )
        self.open = None
        out.append(("content_block_stop", {"type": "content_block_stop", "index": self.index}))
        return out

    def _delta(self, delta: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        return ("content_block_delta", {"type": "content_block_delta", "index": self.index, "delta": delta})

    def event(self, event: StreamEvent) -> list[tuple[str, dict[str, Any]]]:
        if isinstance(event, ReasoningDelta):
            out = (
                []
                if self.open == "thinking"
                else self._start({"type": "thinking", "thinking": "", "signature": ""})
            )
            return [*out, self._delta({"type": "thinking_delta", "thinking": event.text})]
        if isinstance(event, ContentDelta):
            out = [] if self.open == "text" else self._start({"type": "text", "text": ""})
            return [*out, self._delta({"type": "text_delta", "text": event.text})]
        self.has_calls = True
        block = {"type": "tool_use", "id": tool_use_id(), "name": event.call.name, "input": {}}
        out = self._start(block)
        out.append(
            self._delta(
                {
                    "type": "input_json_delta",
                    "partial_json": json.dumps(event.call.arguments, ensure_ascii=False),
                }
            )
        )
        return [*out, *self.close()]
