"""Server-side options of `ninfer-serve` that live above the engine (the engine's own are `EngineConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.request import SamplingParams

MIN_REQUEST_MIB = 4
REQUEST_BYTES_PER_TOKEN = 64  # generous: JSON escapes, tool schemas and whitespace runs included


def default_max_request_mib(max_context: int) -> int:
    """The body limit that still admits any prompt the context can hold, and not much more."""
    return max(MIN_REQUEST_MIB, -(-max_context * REQUEST_BYTES_PER_TOKEN // (1024 * 1024)))


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None
    model_id: str | None = None  # --model-id alias; None = the artifact's identity.model_id
    cors: bool = False
    max_request_mib: int = 16  # ninfer-serve derives it from the context (default_max_request_mib)
    body_timeout_seconds: float = 60.0  # a body that stalls this long between reads is refused (408)
    request_log_jsonl: Path | None = None
    request_log_max_mib: float = 0.0  # 0 = never rotate
    request_log_keep: int = 4
    log_stats_interval_ms: int = 5000
    response_store_max_records: int = 1024
    response_store_max_mib: int = 256
    sampling: SamplingParams = field(default_factory=SamplingParams)  # the sampling flags
    greedy: bool = False
    default_max_tokens: int = 8192
    thinking: bool = True  # --no-thinking turns the default off
    preserve_thinking: bool = False
    tolerant_tool_calls: bool = False
    keepalive_seconds: float = 5.0  # SSE `: keep-alive` comment after this much silence
    metrics_vllm_aliases: bool = False  # also export `vllm:` names for routers that expect them
    artifact_sha256: str = ""  # the verified digest (--expected-sha256), exported in ninfer_model_info

    @property
    def max_request_bytes(self) -> int:
        return self.max_request_mib * 1024 * 1024
