"""The JSONL request log: one JSON object per line, flushed per event, never any prompt or output text.

Every line carries `artifact_type`, `schema_version`, `event`, `timestamp_unix_ms` and `server_instance_id`.
Events: server_start, request_start, request_rejected, request_done, request_error, throughput.

Rotation (`max_bytes` > 0): when the active file reaches `max_bytes`, it becomes `FILE.1` (older ones shift
to `.2` ... and the one past `keep` is deleted) and a fresh file is opened. Lines are written whole under a
lock and rotation happens only between lines, so no line is lost or split across a rotation.
"""

from __future__ import annotations

import json
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ARTIFACT_TYPE = "ninfer_serve_request_log"
SCHEMA_VERSION = 1


class RequestLog:
    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 0, keep: int = 4) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: must be >= 1")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self.instance_id = uuid.uuid4().hex
        self._lock = threading.Lock()
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115 - owned until close()

    def write(self, event: str, **fields: Any) -> None:
        record = {
            "artifact_type": ARTIFACT_TYPE,
            "schema_version": SCHEMA_VERSION,
            "event": event,
            "timestamp_unix_ms": int(time.time() * 1000),
            "server_instance_id": self.instance_id,
            **fields,
        }
        line = json.dumps(record, ensure_ascii=False, default=str) + "\n"
        with self._lock:
            if self._file.closed:
                return
            self._file.write(line)
            self._file.flush()
            if self.max_bytes and self._file.tell() >= self.max_bytes:
                self._rotate()

    def _rotate(self) -> None:
        self._file.close()
        oldest = self.path.with_name(f"{self.path.name}.{self.keep}")
        if oldest.exists():
            oldest.unlink()
        for index in range(self.keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{index}")
            if src.exists():
                src.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._file = open(self.path, "a", encoding="utf-8")  # noqa: SIM115

    def close(self) -> None:
        with self._lock:
            self._file.close()
