"""Operator settings, read once from the environment (the chart sets them on the operator Deployment)."""

from __future__ import annotations

import os
from dataclasses import dataclass

DEFAULT_SERVER_IMAGE = "ghcr.io/ninfer/ninfer-server:0.1.0"


@dataclass(frozen=True)
class OperatorConfig:
    server_image: str = DEFAULT_SERVER_IMAGE  # NINFER_SERVER_IMAGE: used when spec.image is absent
    retry_delay_s: float = 10.0  # NINFER_OPERATOR_RETRY_DELAY: poll period while a verification Job runs
    resync_interval_s: float = 60.0  # NINFER_OPERATOR_RESYNC_INTERVAL: drift-repair timer

    def __post_init__(self) -> None:
        if not self.server_image:
            raise ValueError("server_image must not be empty")
        if self.retry_delay_s <= 0:
            raise ValueError(f"retry_delay_s must be > 0, got {self.retry_delay_s}")
        if self.resync_interval_s <= 0:
            raise ValueError(f"resync_interval_s must be > 0, got {self.resync_interval_s}")

    @classmethod
    def from_env(cls) -> OperatorConfig:
        env = os.environ
        return cls(
            server_image=env.get("NINFER_SERVER_IMAGE", DEFAULT_SERVER_IMAGE),
            retry_delay_s=float(env.get("NINFER_OPERATOR_RETRY_DELAY", "10")),
            resync_interval_s=float(env.get("NINFER_OPERATOR_RESYNC_INTERVAL", "60")),
        )
