"""Request bodies of the OpenAI routes (pydantic). Message and item contents are checked in convert.py,
where errors can name the exact field (`messages[2].content[0].type`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

Role = Literal["system", "developer", "user", "assistant", "tool", "function"]


class SamplingFields(BaseModel):
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = Field(default=None, ge=-1)  # honoured as given (the presets use 20)
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    seed: int | None = None


class ChatCompletionRequest(SamplingFields):
    # Unknown fields are tolerated (clients send vendor extras); unsupported known ones are refused.
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    messages: list[dict[str, Any]] = Field(min_length=1)
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    functions: list[dict[str, Any]] | None = None  # legacy spelling of `tools`
    function_call: str | dict[str, Any] | None = None  # legacy spelling of `tool_choice`
    reasoning_effort: str | None = None
    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    max_tokens: int | None = Field(default=None, ge=1)  # 0 is refused, as on the other two APIs
    max_completion_tokens: int | None = Field(default=None, ge=1)
    # Extension (vLLM's name): keep generating past end-of-sequence tokens, so a benchmark gets exactly
    # max_tokens tokens (finish_reason "length"). Stop strings still stop.
    ignore_eos: bool = False
    stop: str | list[str] | None = None
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    n: int | None = None
    response_format: dict[str, Any] | None = None
    logit_bias: dict[str, float] | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    audio: dict[str, Any] | None = None
    modalities: list[str] | None = None
    user: str | None = None
    metadata: dict[str, Any] | None = None
    store: bool | None = None


class ResponsesRequest(SamplingFields):
    # Responses Core refuses unknown top-level fields (`unknown_parameter`).
    model_config = ConfigDict(extra="forbid")

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
    max_output_tokens: int | None = Field(default=None, ge=1)
    stream: bool = False
    stream_options: dict[str, Any] | None = None
    store: bool = True
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
    text: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    truncation: str | None = None
    user: str | None = None
    include: list[str] | None = None
    top_logprobs: int | None = None
    background: bool | None = None
    service_tier: str | None = None
    prompt_cache_key: str | None = None
    safety_identifier: str | None = None
    enable_thinking: bool | None = None
    preserve_thinking: bool | None = None
    chat_template_kwargs: dict[str, Any] | None = None
    stop: str | list[str] | None = None


class InputTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str | None = None
    input: str | list[dict[str, Any]] = Field(default_factory=list)
    instructions: str | None = None
    tools: list[dict[str, Any]] | None = None
    previous_response_id: str | None = None
    reasoning: dict[str, Any] | None = None
