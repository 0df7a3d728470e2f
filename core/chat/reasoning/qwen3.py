"""Qwen3's think blocks: ``<think>`` reasoning ``</think>`` answer.

Where the output starts is read from the prompt, not guessed from the output: with thinking off
the template already wrote ``<think>\\n\\n</think>\\n\\n`` (the whole output is content); a
template that writes ``<think>`` itself leaves the block open (the output is reasoning until
``</think>``); otherwise the output may open a block as its first thing. Any end of the text
that could still grow into a tag is held back, so a tag spelled by several tokens never leaks
into either field. Reasoning is trimmed of surrounding whitespace, and so is the start of the
answer after ``</think>`` (the template trims both when it renders the turn again).
"""
from __future__ import annotations

from typing import ClassVar

from ..tags import partial_tag_length
from .base import ReasoningDelta, ThinkState

START, END = "<think>", "</think>"


class Qwen3ReasoningParser:
    name: ClassVar[str] = "qwen3"
    end_tag: ClassVar[str | None] = END

    def __init__(self, state: ThinkState) -> None:
        self._mode = {ThinkState.MAYBE: "start", ThinkState.OPEN: "reasoning"}.get(state, "content")
        self._held = ""  # text not yet given out: a possible tag, or whitespace that may be trimmed
        self._reasoning_started = False

    @classmethod
    def prompt_state(cls, generation_prompt: str) -> ThinkState:
        """Read from the text the template appends for the new turn."""
        opened, closed = generation_prompt.rfind(START), generation_prompt.rfind(END)
        if opened == closed == -1:
            return ThinkState.MAYBE
        return ThinkState.OPEN if opened > closed else ThinkState.CLOSED

    def feed(self, text: str) -> ReasoningDelta:
        self._held += text
        return self._drain(final=False)

    def finish(self) -> ReasoningDelta:
        return self._drain(final=True)

    def extract(self, text: str) -> ReasoningDelta:
        return self.feed(text) + self.finish()

    def _drain(self, final: bool) -> ReasoningDelta:
        out = ReasoningDelta()
        while self._held:
            if self._mode == "start":
                head = self._held.lstrip()
                if head.startswith(START):
                    self._held, self._mode = head[len(START):], "reasoning"
                elif START.startswith(head) and not final:
                    break  # only whitespace or the beginning of <think> so far
                else:
                    self._mode = "content"
            elif self._mode == "reasoning":
                if not self._reasoning_started:
                    self._held = self._held.lstrip()
                    self._reasoning_started = bool(self._held)
                end = self._held.find(END)
                if end >= 0:
                    out.reasoning += self._held[:end].rstrip()
                    self._held, self._mode = self._held[end + len(END):], "answer"
                    continue
                if final:
                    out.reasoning += self._held.rstrip()
                    self._held = ""
                    break
                keep = partial_tag_length(self._held, END)
                ready = self._held[:len(self._held) - keep]
                given = ready.rstrip()  # trailing whitespace waits: it is trimmed if </think> follows
                out.reasoning += given
                self._held = self._held[len(given):]
                break
            elif self._mode == "answer":  # just after </think>: trim the answer's leading whitespace
                self._held = self._held.lstrip()
                if self._held:
                    self._mode = "content"
            else:
                out.content += self._held
                self._held = ""
        return out
