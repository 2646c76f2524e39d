"""Server-side options of `ninfer-serve` that live above the engine (the engine's own are `EngineConfig`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from engine.request import SamplingParams


@dataclass(frozen=True)
class ServerOptions:
    api_key: str | None = None
    model_id: str | None = None  # --model-id alias; None = the artifact's identity.model_id
    cors: bool = False
    max_request_mib: int = 384
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
