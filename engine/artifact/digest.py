"""Whole-file SHA-256, streamed once with a progress bar (the artifact's identity outside the format)."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from engine.progress import progress

CHUNK_BYTES = 8 * 1024 * 1024


def sha256_file(path: str | os.PathLike[str], *, show_progress: bool | None = None) -> str:
    path = Path(path)
    digest = hashlib.sha256()
    with (
        open(path, "rb") as f,
        progress(path.stat().st_size, f"sha256 {path.name}", force=show_progress) as bar,
    ):
        while chunk := f.read(CHUNK_BYTES):
            digest.update(chunk)
            bar.update(len(chunk))
    return digest.hexdigest()


def is_sha256_hex(value: str) -> bool:
    return len(value) == 64 and all(c in "0123456789abcdef" for c in value.lower())
