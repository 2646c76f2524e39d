"""Request bodies of the Anthropic routes (pydantic); content blocks are checked in convert.py."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class MessagesRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str  # any label; echoed back
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    stop_sequences: list[str] | None = None
    stream: bool = False
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = Field(default=None, ge=-1)
    thinking: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    service_tier: str | None = None


class CountTokensRequest(BaseModel):
    model_config = ConfigDict(extra="allow")

    model: str
    messages: list[dict[str, Any]] = Field(min_length=1)
    system: str | list[dict[str, Any]] | None = None
    thinking: dict[str, Any] | None = None
    tools: list[dict[str, Any]] | None = None
    tool_choice: dict[str, Any] | None = None
