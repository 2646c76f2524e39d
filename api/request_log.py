"""The JSONL request log: one JSON object per line, flushed per event, never any prompt or output text.

Every line carries `artifact_type`, `schema_version`, `event`, `timestamp_unix_ms` and `server_instance_id`.
Events: server_start, request_start, request_rejected, request_done, request_error, throughput.

Whole lines only. Each line goes to the file in one `write` on an O_APPEND descriptor; a write that fails or
is cut short (disk full, file-size limit, I/O error) is undone by truncating the file back to where the line
began, so a later line never lands glued to a fragment. A failed write never raises: it is counted
(`write_errors`, which the server exports as a metric and in /stats) and warned about, and serving goes on.
On open, a last line without its newline (a crash or SIGKILL mid-write) is moved to `FILE.partial` and cut
from the log, so the first new record starts on a line of its own (`repaired_bytes` says how much moved).
String values longer than `MAX_STRING_CHARS` (a multi-MiB `model` label) are cut, with the size noted.

Rotation (`max_bytes` > 0): when the active file reaches `max_bytes`, it becomes `FILE.1` (older ones shift
to `.2` ... and the one past `keep` is deleted) and a fresh file is opened. Rotation happens only between
lines, so no line is lost or split across a rotation.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import uuid
from pathlib import Path
from typing import Any

ARTIFACT_TYPE = "ninfer_serve_request_log"
SCHEMA_VERSION = 1
MAX_STRING_CHARS = 1024
WARN_INTERVAL_SECONDS = 60.0

logger = logging.getLogger("ninfer.api")


def shorten(value: Any) -> Any:
    """`value` with every string longer than MAX_STRING_CHARS cut (nested dicts and lists included)."""
    if isinstance(value, str) and len(value) > MAX_STRING_CHARS:
        return f"{value[:MAX_STRING_CHARS]}...(+{len(value) - MAX_STRING_CHARS} chars)"
    if isinstance(value, dict):
        return {k: shorten(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [shorten(v) for v in value]
    return value


def repair_tail(path: Path) -> int:
    """Move a last line that lacks its newline to `PATH.partial`; return its size in bytes (0 = intact)."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if size == 0:
        return 0
    with open(path, "rb+") as f:
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return 0
        start = size
        while start > 0:  # find the last newline, reading backwards in blocks
            block = min(65536, start)
            f.seek(start - block)
            data = f.read(block)
            at = data.rfind(b"\n")
            if at >= 0:
                start = start - block + at + 1
                break
            start -= block
        f.seek(start)
        fragment = f.read()
        with open(path.with_name(path.name + ".partial"), "ab") as quarantine:
            quarantine.write(fragment + b"\n")
            quarantine.flush()
            os.fsync(quarantine.fileno())
        f.truncate(start)
    return size - start


class RequestLog:
    def __init__(self, path: str | os.PathLike[str], *, max_bytes: int = 0, keep: int = 4) -> None:
        if keep < 1:
            raise ValueError(f"keep={keep}: must be >= 1")
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.keep = keep
        self.instance_id = uuid.uuid4().hex
        self.write_errors = 0
        self.last_error: str | None = None
        self._warned_at = -WARN_INTERVAL_SECONDS
        self._lock = threading.Lock()
        self.repaired_bytes = repair_tail(self.path)
        if self.repaired_bytes:
            logger.warning(
                "request log %s ended in a cut-off line (%d bytes); moved it to %s.partial",
                self.path,
                self.repaired_bytes,
                self.path.name,
            )
        self._closed = False
        self._fd: int | None = self._open()

    def _open(self) -> int:
        return os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(self, event: str, **fields: Any) -> bool:
        """Append one record; False (counted, warned about) when it could not be written whole."""
        record = {
            "artifact_type": ARTIFACT_TYPE,
            "schema_version": SCHEMA_VERSION,
            "event": event,
            "timestamp_unix_ms": int(time.time() * 1000),
            "server_instance_id": self.instance_id,
            **shorten(fields),
        }
        line = (json.dumps(record, ensure_ascii=False, default=str) + "\n").encode("utf-8", "replace")
        with self._lock:
            if self._closed:
                return False
            try:
                if self._fd is None:  # a rotation could not reopen the file: try again
                    self._fd = self._open()
                self._append(self._fd, line)
                if self.max_bytes and os.fstat(self._fd).st_size >= self.max_bytes:
                    self._rotate()
            except OSError as exc:
                self._failed(exc)
                return False
        return True

    @staticmethod
    def _append(fd: int, line: bytes) -> None:
        """One write of the whole line; a failed or short write is undone (the file is cut back)."""
        start = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
        except OSError:
            os.ftruncate(fd, start)
            raise
        if written != len(line):
            os.ftruncate(fd, start)
            raise OSError(f"short write ({written} of {len(line)} bytes)")

    def _failed(self, exc: OSError) -> None:
        self.write_errors += 1
        self.last_error = str(exc)
        now = time.monotonic()
        if now - self._warned_at >= WARN_INTERVAL_SECONDS:
            self._warned_at = now
            logger.warning(
                "request log %s: a line could not be written (%s); %d lost so far, serving goes on",
                self.path,
                exc,
                self.write_errors,
            )

    def _rotate(self) -> None:
        assert self._fd is not None
        os.close(self._fd)
        self._fd = None
        oldest = self.path.with_name(f"{self.path.name}.{self.keep}")
        if oldest.exists():
            oldest.unlink()
        for index in range(self.keep - 1, 0, -1):
            src = self.path.with_name(f"{self.path.name}.{index}")
            if src.exists():
                src.replace(self.path.with_name(f"{self.path.name}.{index + 1}"))
        self.path.replace(self.path.with_name(f"{self.path.name}.1"))
        self._fd = self._open()

    def stats(self) -> dict[str, Any]:
        return {
            "path": str(self.path),
            "write_errors": self.write_errors,
            "last_error": self.last_error,
            "repaired_bytes": self.repaired_bytes,
        }

    def close(self) -> None:
        with self._lock:
            self._closed = True
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None
