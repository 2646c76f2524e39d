"""The Responses store: a process-local LRU of finished responses, bounded by records and bytes.

A record keeps the response object and the full item history that produced it (input items of this and
every earlier turn, then this turn's output items), so `previous_response_id` rebuilds the conversation
and `GET /v1/responses/{id}/input_items` can list its inputs.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class StoredResponse:
    response: dict[str, Any]
    input_items: list[dict[str, Any]]  # everything that went in (history included), with ids
    output_items: list[dict[str, Any]]
    num_bytes: int


class ResponseStore:
    def __init__(self, max_records: int, max_bytes: int) -> None:
        self.max_records = max_records
        self.max_bytes = max_bytes
        self._records: OrderedDict[str, StoredResponse] = OrderedDict()
        self._lock = threading.Lock()
        self.num_bytes = 0

    def __len__(self) -> int:
        return len(self._records)

    def put(
        self, response: dict[str, Any], input_items: list[dict[str, Any]], output_items: list[dict[str, Any]]
    ) -> None:
        size = len(json.dumps([response, input_items, output_items], ensure_ascii=False))
        if self.max_records == 0 or size > self.max_bytes:
            return
        record = StoredResponse(response, input_items, output_items, size)
        with self._lock:
            old = self._records.pop(response["id"], None)
            if old is not None:
                self.num_bytes -= old.num_bytes
            self._records[response["id"]] = record
            self.num_bytes += size
            while len(self._records) > self.max_records or self.num_bytes > self.max_bytes:
                _, dropped = self._records.popitem(last=False)
                self.num_bytes -= dropped.num_bytes

    def get(self, response_id: str) -> StoredResponse | None:
        with self._lock:
            record = self._records.get(response_id)
            if record is not None:
                self._records.move_to_end(response_id)
            return record

    def delete(self, response_id: str) -> bool:
        with self._lock:
            record = self._records.pop(response_id, None)
            if record is None:
                return False
            self.num_bytes -= record.num_bytes
            return True
