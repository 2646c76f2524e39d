"""Follow a JSONL file across rotation (rename + new file) and truncation (copy-truncate).

`JsonlTail.poll()` returns the complete lines appended since the last call, decoded as JSON objects.
It holds the file open, so after a rename it first drains what the old file still had (written before the
writer reopened), then reads any file rotated after it (`FILE.k-1` ... `FILE.1`, when the writer rotated
several times between two polls), then switches to the new file at the path. A file that became shorter than the read
offset was truncated in place: reading restarts at its beginning. A line without its newline yet is
kept until the rest arrives. On the first open, at most `backfill_bytes` of existing content are read
(the start of a cut line is skipped).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import IO, Any

MAX_LINE_BYTES = 1 << 20  # a longer "line" is dropped (never the case for the request log)
MAX_ROTATED = 16  # rotated files (`FILE.1` ...) searched when several rotations happened between polls


class JsonlTail:
    def __init__(self, path: str | os.PathLike[str], *, backfill_bytes: int = 8 << 20) -> None:
        self.path = Path(path)
        self.backfill_bytes = backfill_bytes
        self._file: IO[bytes] | None = None
        self._inode: tuple[int, int] | None = None
        self._pending = b""
        self._first_open = True
        self.lines_read = 0
        self.malformed = 0
        self.rotations = 0
        self.truncations = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def poll(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        if self._file is None and not self._open():
            return out
        assert self._file is not None
        try:
            st = os.stat(self.path)
        except FileNotFoundError:
            st = None
        if st is not None and (st.st_dev, st.st_ino) != self._inode:
            out += self._drain()  # rotated: finish the old file, then any rotated since, then the new one
            self.rotations += 1
            self.close()
            for between in self._rotated_since():
                self.rotations += 1
                out += self._read_whole(between)
            self._pending = b""
            if self._open():
                out += self._drain()
            return out
        if st is not None and st.st_size < self._file.tell():
            self.truncations += 1
            self._file.seek(0)
            self._pending = b""
        out += self._drain()
        return out

    def _rotated_since(self) -> list[Path]:
        """Files the writer rotated after the one we held (`FILE.k-1` ... `FILE.1` when ours is `FILE.k`)."""
        newer: list[Path] = []
        for index in range(1, MAX_ROTATED + 1):
            candidate = self.path.with_name(f"{self.path.name}.{index}")
            try:
                st = os.stat(candidate)
            except FileNotFoundError:
                return []  # ours is gone (deleted or past `keep`): nothing known to be newer
            if (st.st_dev, st.st_ino) == self._inode:
                return newer[::-1]
            newer.append(candidate)
        return []

    def _read_whole(self, path: Path) -> list[dict[str, Any]]:
        try:
            with open(path, "rb") as f:
                self._file, self._pending = f, b""
                return self._drain() + self._flush_pending()
        except FileNotFoundError:
            return []
        finally:
            self._file = None

    def _flush_pending(self) -> list[dict[str, Any]]:
        """A rotated file is complete: its last line needs no newline."""
        rest, self._pending = self._pending, b""
        return self._parse([rest]) if rest.strip() else []

    def _open(self) -> bool:
        try:
            f = open(self.path, "rb")  # noqa: SIM115 - held open across polls, closed in close()
        except FileNotFoundError:
            return False
        st = os.fstat(f.fileno())
        self._file, self._inode = f, (st.st_dev, st.st_ino)
        if self._first_open and st.st_size > self.backfill_bytes:
            f.seek(st.st_size - self.backfill_bytes)
            f.readline()  # skip the cut line
        self._first_open = False
        return True

    def _drain(self) -> list[dict[str, Any]]:
        assert self._file is not None
        data = self._pending + self._file.read()
        lines = data.split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_LINE_BYTES:
            self._pending = b""
        return self._parse(lines)

    def _parse(self, lines: list[bytes]) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for raw in lines:
            if not raw.strip():
                continue
            self.lines_read += 1
            try:
                record = json.loads(raw)
            except (UnicodeDecodeError, json.JSONDecodeError):
                self.malformed += 1
                continue
            if isinstance(record, dict):
                out.append(record)
            else:
                self.malformed += 1
        return out
