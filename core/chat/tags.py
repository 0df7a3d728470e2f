"""Finding tags in text that arrives in pieces: what may still turn into a tag is held back."""
from __future__ import annotations


def partial_tag_length(text: str, tag: str) -> int:
    """Length of the longest end of ``text`` that is a proper beginning of ``tag``: those
    characters may be the first half of a tag split across two deltas."""
    for n in range(min(len(tag) - 1, len(text)), 0, -1):
        if text.endswith(tag[:n]):
            return n
    return 0
