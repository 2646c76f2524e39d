"""Rendering chat templates: a sandboxed Jinja environment shaped like transformers' own.

`render_chat_template` gives the same string as `transformers`' `apply_chat_template(..., tokenize=False)`
for the same template, messages and keyword arguments: the same environment options (trim/lstrip blocks,
loop controls), the same `tojson` (plain `json.dumps`, no HTML escaping), `raise_exception` and
`strftime_now`, and the same aliasing of a message's reasoning field names. Template errors surface as
`ChatTemplateError` (a `ValueError`) so the HTTP layer can answer 400 with the template's message.

It also normalizes what OpenAI-style clients send: a tool call's `arguments` given as a JSON string is
parsed into the object the template iterates over. Messages passed in are never mutated.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

# Names a message's reasoning arrives under; the template reads `reasoning_content`.
_REASONING_FIELDS = ("reasoning_content", "reasoning", "thinking")
# Appended to a prefill's text to find where it ends in the rendered prompt (cannot occur in real text).
_CONTINUE_MARK = "\x00ninfer-continue\x00"


class ChatTemplateError(ValueError):
    """The messages cannot be rendered (the template refused them, or they are malformed)."""


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


@functools.lru_cache(maxsize=8)
def compile_chat_template(text: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    try:
        return env.from_string(text)
    except jinja2.TemplateSyntaxError as exc:
        raise ChatTemplateError(f"chat template does not compile: {exc}") from exc


def normalize_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Copies of `messages` as plain dicts, with reasoning aliased and tool-call arguments decoded."""
    out: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ChatTemplateError(f"messages[{index}] must be an object with a string 'role'")
        item = dict(message)
        reasoning = next((item[k] for k in _REASONING_FIELDS if item.get(k) is not None), None)
        if reasoning is not None:
            item["reasoning_content"] = reasoning
        if item.get("tool_calls"):
            item["tool_calls"] = [_normalize_tool_call(index, call) for call in item["tool_calls"]]
        out.append(item)
    return out


def _normalize_tool_call(index: int, call: Any) -> Any:
    if not isinstance(call, Mapping):
        raise ChatTemplateError(f"messages[{index}].tool_calls entries must be objects")
    call = dict(call)
    holder = dict(call["function"]) if isinstance(call.get("function"), Mapping) else call
    arguments = holder.get("arguments")
    if isinstance(arguments, str):
        try:
            decoded = json.loads(arguments) if arguments.strip() else {}
        except json.JSONDecodeError as exc:
            raise ChatTemplateError(
                f"messages[{index}] tool call arguments are not valid JSON: {exc}"
            ) from exc
        if not isinstance(decoded, dict):
            raise ChatTemplateError(f"messages[{index}] tool call arguments must be a JSON object")
        holder["arguments"] = decoded
    if holder is not call:
        call["function"] = holder
    return call


def render_chat_template(
    template: str,
    messages: Sequence[Mapping[str, Any]],
    *,
    tools: Sequence[Mapping[str, Any]] | None = None,
    add_generation_prompt: bool = True,
    continue_final_message: bool = False,
    **kwargs: Any,
) -> str:
    """Render `template` (Jinja text) for `messages`; extra keyword arguments become template variables.

    `continue_final_message`: the last message is an assistant turn to be continued (a prefill); the
    prompt ends right after its text instead of closing the turn (as transformers' option of that name).
    """
    compiled = compile_chat_template(template)
    items = normalize_messages(messages)
    if continue_final_message:
        if add_generation_prompt:
            raise ChatTemplateError("continue_final_message and add_generation_prompt exclude each other")
        if not items or items[-1]["role"] != "assistant" or not isinstance(items[-1].get("content"), str):
            raise ChatTemplateError(
                "continue_final_message needs a final assistant message with text content"
            )
        items[-1]["content"] += _CONTINUE_MARK
    try:
        text = compiled.render(
            messages=items,
            tools=list(tools) if tools else None,
            add_generation_prompt=add_generation_prompt,
            **kwargs,
        )
    except jinja2.TemplateError as exc:
        raise ChatTemplateError(str(exc)) from exc
    except (TypeError, AttributeError, KeyError) as exc:
        raise ChatTemplateError(f"malformed messages for the chat template: {exc}") from exc
    if continue_final_message:
        if _CONTINUE_MARK not in text:
            raise ChatTemplateError("the chat template dropped the final assistant message's text")
        text = text[: text.index(_CONTINUE_MARK)]
    return text
