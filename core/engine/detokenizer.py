"""Incremental detokenization with stop strings.

Text is released only when it is final: a trailing partial UTF-8 character (decoded as U+FFFD)
and any tail that could still grow into a stop string are held back. The concatenation of all
released pieces is therefore exactly the text a non-streaming reply returns.
"""
from __future__ import annotations

from typing import Callable, Sequence

REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    def __init__(self, decode: Callable[[Sequence[int]], str], stop: Sequence[str] = (), min_tokens: int = 0) -> None:
        """Stop strings count only once more than min_tokens tokens were added (as vLLM's
        min_tokens, which holds back EOS and stop token ids too)."""
        self._decode = decode
        self.stop = tuple(stop)
        self.min_tokens = min_tokens
        self._ids: list[int] = []
        self._stable_ids = 0  # ids[:_stable_ids] decode to _stable_text, ending on a whole char
        self._stable_text = ""
        self.text = ""  # decoded so far (possibly cut at a stop string)
        self._released = 0  # len of text already handed out
        self.stopped_by: str | None = None

    def add(self, token_id: int) -> None:
        """Append a token; sets stopped_by when the text reaches a stop string."""
        if self.stopped_by is not None:
            return
        self._ids.append(token_id)
        # Decode only the tail since the last point that ended on a complete character:
        # byte-level BPE decodes prefix-stably there, so the whole text never needs redoing.
        tail = self._decode(self._ids[self._stable_ids:])
        previous_len = len(self.text)
        self.text = self._stable_text + tail
        if not tail.endswith(REPLACEMENT):
            self._stable_ids = len(self._ids)
            self._stable_text = self.text
        if self.stop and len(self._ids) > self.min_tokens:
            self._find_stop(previous_len)

    def _find_stop(self, previous_len: int) -> None:
        longest = max(len(s) for s in self.stop)
        window_start = max(0, previous_len - longest + 1)
        hits = [(self.text.find(s, window_start), s) for s in self.stop]
        hits = [(i, s) for i, s in hits if i >= 0]
        if hits:
            index, stop = min(hits)
            self.text = self.text[:index]
            self.stopped_by = stop

    def release(self, final: bool = False) -> str:
        """New text that can no longer change. final=True flushes everything (request ended)."""
        end = len(self.text)
        if not final:
            if self.text.endswith(REPLACEMENT):
                end = len(self.text.rstrip(REPLACEMENT))
            end = min(end, len(self.text) - self._stop_prefix_len())
        piece = self.text[self._released:end] if end > self._released else ""
        self._released = max(self._released, end)
        return piece

    def _stop_prefix_len(self) -> int:
        """Length of the longest text suffix that is a proper prefix of some stop string."""
        best = 0
        for stop in self.stop:
            for n in range(min(len(stop) - 1, len(self.text)), best, -1):
                if self.text.endswith(stop[:n]):
                    best = n
                    break
        return best
