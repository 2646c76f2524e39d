"""The request-log tail: no line lost or repeated across rotation (api/request_log.py's own rotation),
copy-truncation, partial writes, a file that appears late, and a bounded backfill."""

from __future__ import annotations

import json
from pathlib import Path

from api.request_log import RequestLog
from monitor.sidecar.tail import JsonlTail


def ids(records: list[dict]) -> list[int]:
    return [r["n"] for r in records]


def test_follows_the_servers_own_rotation_without_losing_or_repeating_lines(tmp_path: Path) -> None:
    path = tmp_path / "requests.jsonl"
    log = RequestLog(path, max_bytes=600, keep=3)  # rotates every few lines
    tail = JsonlTail(path)
    seen: list[int] = []
    for n in range(60):
        log.write("request_done", n=n)
        if n % 7 == 0:
            seen += ids(tail.poll())
    seen += ids(tail.poll())
    log.close()
    assert seen == list(range(60))
    assert tail.rotations >= 3
    assert (tmp_path / "requests.jsonl.1").exists()


def test_rotation_between_polls_drains_the_old_file_first(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text('{"n": 0}\n')
    tail = JsonlTail(path)
    assert ids(tail.poll()) == [0]
    with path.open("a") as f:
        f.write('{"n": 1}\n')
    path.rename(tmp_path / "log.jsonl.1")
    path.write_text('{"n": 2}\n{"n": 3}\n')
    assert ids(tail.poll()) == [1, 2, 3]


def test_copy_truncate_restarts_at_the_beginning(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({"n": n}) + "\n" for n in range(5)))
    tail = JsonlTail(path)
    assert ids(tail.poll()) == [0, 1, 2, 3, 4]
    with path.open("r+") as f:
        f.truncate(0)
    with path.open("a") as f:
        f.write('{"n": 5}\n')
    assert ids(tail.poll()) == [5]
    assert tail.truncations == 1


def test_partial_lines_wait_for_their_end_and_junk_is_counted(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    tail = JsonlTail(path)
    assert tail.poll() == []  # no file yet
    with path.open("a") as f:
        f.write('{"n": 0}\n{"n": ')
    assert ids(tail.poll()) == [0]
    with path.open("a") as f:
        f.write("1}\nnot json\n[1, 2]\n")
    assert ids(tail.poll()) == [1]
    assert tail.malformed == 2


def test_backfill_is_bounded_and_skips_the_cut_line(tmp_path: Path) -> None:
    path = tmp_path / "log.jsonl"
    path.write_text("".join(json.dumps({"n": n, "pad": "x" * 50}) + "\n" for n in range(100)))
    got = ids(JsonlTail(path, backfill_bytes=700).poll())
    assert got and got[-1] == 99 and len(got) < 12 and got == list(range(got[0], 100))
