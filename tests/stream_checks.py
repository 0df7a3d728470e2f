"""What a test checks in a streamed answer: an SSE body's events (single-line `data:` events
and the server's keep-alive comments, nothing else), and the openai client's chunk contract."""
from __future__ import annotations

from typing import Any

KEEPALIVE = ": keep-alive"


def sse_events(raw: bytes) -> list[str]:
    """Every event of an SSE body, each a single line followed by a blank line (fails on a
    missing terminator or a multi-line event): `data: ...` events and `: keep-alive` comments."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-80:]!r}"
    events = text[:-2].split("\n\n")
    for event in events:
        assert (event.startswith("data: ") or event == KEEPALIVE) and "\n" not in event, \
            f"not a single-line data event or keep-alive comment: {event!r}"
    return events


def parse_sse(raw: bytes) -> list[str]:
    """The payloads of an SSE body that must consist only of `data: ...` events, each followed
    by a blank line, and the server's `: keep-alive` comments (skipped; a slow machine may see
    them); fails on anything else (other comments, other fields, a missing terminator)."""
    return [event[len("data: "):] for event in sse_events(raw) if event != KEEPALIVE]


class StreamCollector:
    """Joins the chunks of an openai-client stream and checks the chunk contract on the way:
    the first chunk only says role "assistant"; finish_reason and usage appear once, in the
    last chunk."""

    def __init__(self) -> None:
        self.chunks: list[Any] = []
        self.pieces: list[str] = []
        self.logprobs: list[Any] = []

    def add(self, chunk: Any) -> None:
        assert chunk.object == "chat.completion.chunk"
        if not self.chunks:
            assert chunk.choices[0].delta.role == "assistant" and not chunk.choices[0].delta.content
        self.chunks.append(chunk)
        choice = chunk.choices[0]
        self.pieces.append(choice.delta.content or "")
        if choice.logprobs is not None and choice.logprobs.content:
            self.logprobs.extend(choice.logprobs.content)

    def collect(self, stream) -> "StreamCollector":
        for chunk in stream:
            self.add(chunk)
        return self

    async def acollect(self, stream) -> "StreamCollector":
        async for chunk in stream:
            self.add(chunk)
        return self

    @property
    def text(self) -> str:
        return "".join(self.pieces)

    @property
    def finish_reason(self) -> str:
        reasons = [(i, c.choices[0].finish_reason) for i, c in enumerate(self.chunks) if c.choices[0].finish_reason]
        assert len(reasons) == 1 and reasons[0][0] == len(self.chunks) - 1, f"finish_reason in chunks {reasons}"
        return reasons[0][1]

    @property
    def usage(self) -> Any:
        usages = [(i, c.usage) for i, c in enumerate(self.chunks) if c.usage is not None]
        assert len(usages) == 1 and usages[0][0] == len(self.chunks) - 1, f"usage in chunks {[i for i, _ in usages]}"
        return usages[0][1]
