"""Server-Sent Events split out of network reads, each stamped with the time its last byte
arrived: the client-side clock of TTFT and inter-token latency.

Pure: it takes (bytes, timestamp) pairs and knows nothing about sockets, so it is tested on
hand-made byte streams (events split across reads, several in one read, CRLF, comments).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterator

DONE = "[DONE]"


@dataclass(frozen=True)
class Event:
    data: str
    arrived: float  # when the read that completed this event returned, in the caller's clock

    @property
    def done(self) -> bool:
        return self.data == DONE

    def json(self) -> Any:
        return json.loads(self.data)


class SSEParser:
    """Feed reads in order; get back every event that a read completed. Lines other than
    `data:` (comments, `event:`, `id:`, `retry:`) are skipped; several `data:` lines of one
    event are joined with newlines, as the SSE standard says."""

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[str] = []

    def feed(self, chunk: bytes, arrived: float) -> Iterator[Event]:
        self._buffer += chunk
        while True:
            end = self._buffer.find(b"\n")
            if end < 0:
                return
            line = self._buffer[:end].rstrip(b"\r").decode("utf-8")
            self._buffer = self._buffer[end + 1:]
            if not line:
                if self._data:
                    yield Event("\n".join(self._data), arrived)
                    self._data = []
            elif line.startswith("data:"):
                value = line[5:]
                self._data.append(value[1:] if value.startswith(" ") else value)

    def close(self, arrived: float) -> Iterator[Event]:
        """The stream ended: an event without its closing blank line still counts."""
        if self._buffer.strip():
            yield from self.feed(b"\n\n", arrived)
        elif self._data:
            yield Event("\n".join(self._data), arrived)
            self._data = []


def content_of(payload: dict[str, Any]) -> str:
    """The generated text a chat or completions stream chunk carries ('' for role or usage chunks)."""
    choices = payload.get("choices") or []
    if not choices:
        return ""
    choice = choices[0]
    if "delta" in choice:
        delta = choice["delta"] or {}
        return (delta.get("content") or "") + (delta.get("reasoning_content") or "")
    return choice.get("text") or ""
