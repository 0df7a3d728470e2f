"""Stored responses, for GET /v1/responses/{id} and previous_response_id: in memory, least
recently used first out once their size passes a bound (--responses-store-mb; 0 keeps none).

Each entry keeps the whole conversation so far as input items (the ones it continued, its
input, its output), so a chain of turns survives its older entries' eviction; a long chain
costs its length again in every entry, which the byte bound accounts for.
"""
from __future__ import annotations

import json
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class StoredResponse:
    response: dict[str, Any]
    items: list[dict[str, Any]]  # the conversation up to and including this response, as input items
    size: int  # bytes, as JSON


class ResponseStore:
    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = max_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[str, StoredResponse] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, response: dict[str, Any], items: list[dict[str, Any]]) -> None:
        """Keep ``response`` (unless it alone is larger than the bound), evicting the least
        recently used until everything fits."""
        size = len(json.dumps([response, items], ensure_ascii=False).encode())
        if size > self.max_bytes:
            return
        self.delete(response["id"])
        self._entries[response["id"]] = StoredResponse(response, items, size)
        self.used_bytes += size
        while self.used_bytes > self.max_bytes:
            _, evicted = self._entries.popitem(last=False)
            self.used_bytes -= evicted.size

    def get(self, response_id: str) -> StoredResponse | None:
        entry = self._entries.get(response_id)
        if entry is not None:
            self._entries.move_to_end(response_id)
        return entry

    def delete(self, response_id: str) -> bool:
        entry = self._entries.pop(response_id, None)
        if entry is None:
            return False
        self.used_bytes -= entry.size
        return True
