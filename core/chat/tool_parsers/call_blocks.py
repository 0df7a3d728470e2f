"""The streaming half every tagged tool-call format shares: text between ``<tool_call>`` and
``</tool_call>`` is a block, everything else content, whatever the block's body looks like.

``read_call`` turns a block's body into a call, or None: then the block stays content, tags
and all, so nothing the model wrote is lost and bad output is never an error. Whitespace next
to a call only separates and is kept only between two pieces of content. A call is given out
whole once its block closes (or, for the last block, when the output ends), so a stream never
shows a call that later turns out invalid; the end of the text that may still grow into a tag
is held back, so a tag split across tokens never leaks into content.
"""
from __future__ import annotations

from typing import Callable

from ..tags import partial_tag_length
from .base import ToolCall, ToolDelta

START, END = "<tool_call>", "</tool_call>"


class ToolCallBlocks:
    def __init__(self, read_call: Callable[[str], ToolCall | None]) -> None:
        self._read_call = read_call
        self._held = ""  # not looked at yet, or the beginning of a tag
        self._in_call = False
        self._space = ""  # whitespace waiting for what follows it
        self._space_touches_call = False  # ... and whether a call is next to it
        self._content_given = False

    def feed(self, text: str) -> ToolDelta:
        self._held += text
        return self._drain(final=False)

    def finish(self) -> ToolDelta:
        return self._drain(final=True)

    def extract(self, text: str) -> ToolDelta:
        return self.feed(text) + self.finish()

    def _drain(self, final: bool) -> ToolDelta:
        out = ToolDelta()
        while self._held:
            if self._in_call:
                end = self._held.find(END)
                if end < 0 and not final:
                    break
                body, closed = (self._held[:end], True) if end >= 0 else (self._held, False)
                self._held = self._held[end + len(END):] if closed else ""
                self._in_call = False
                call = self._read_call(body)
                if call is None:
                    self._give(START + body + (END if closed else ""), out)
                else:
                    out.calls.append(call)
                    self._space_touches_call = True
                continue
            start = self._held.find(START)
            if start >= 0:
                self._text(self._held[:start], out)
                self._held, self._in_call = self._held[start + len(START):], True
                continue
            ready = self._held if final else self._held[:len(self._held) - partial_tag_length(self._held, START)]
            self._text(ready, out)
            self._held = self._held[len(ready):]
            break
        if final:
            if not self._space_touches_call:
                out.content += self._space  # plain trailing whitespace of the reply
            self._space = ""
        return out

    def _text(self, text: str, out: ToolDelta) -> None:
        """Content outside calls: its trailing whitespace waits, since a call may follow."""
        if self._space_touches_call:
            body = text.lstrip()
            self._space += text[:len(text) - len(body)]
            text = body
        body = text.rstrip()
        if not body:
            self._space += text
            return
        self._give(body, out)
        self._space = text[len(body):]

    def _give(self, text: str, out: ToolDelta) -> None:
        if self._content_given or not self._space_touches_call:
            out.content += self._space  # whitespace between two pieces of content
        out.content += text
        self._space, self._space_touches_call, self._content_given = "", False, True
