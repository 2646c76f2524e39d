"""Chat formatting for the Qwen3.5 family: the chat template, its renderer, and the output parsers.

- `template`: render a Jinja chat template the way transformers does (sandboxed).
- `parse`: reasoning / content / tool-call parsing of generated text, whole or streamed.
- `qwen35`: the real Qwen3.5 tokenizer files, built offline, and our chat template text.
"""

from engine.chat.parse import (
    ContentDelta,
    ParsedOutput,
    ReasoningDelta,
    StreamingParser,
    ToolCall,
    ToolCallEvent,
    parse_output,
    prompt_ends_in_reasoning,
)
from engine.chat.template import ChatTemplateError, render_chat_template

__all__ = [
    "ChatTemplateError",
    "ContentDelta",
    "ParsedOutput",
    "ReasoningDelta",
    "StreamingParser",
    "ToolCall",
    "ToolCallEvent",
    "parse_output",
    "prompt_ends_in_reasoning",
    "render_chat_template",
]
