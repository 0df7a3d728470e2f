"""Prompt lookup (n-gram) proposing: text that quotes, repeats or edits its input is full of
spans seen before, so the tokens that followed the last occurrence of the context's final
n-gram are a free guess at what comes next (as vLLM's ``ngram`` method and transformers'
``prompt_lookup_num_tokens``)."""
from __future__ import annotations

from typing import Sequence


class NgramProposer:
    """Tries the longest suffix n-gram first (max_n down to min_n); for each n the most recent
    earlier occurrence wins, and what followed it (up to the limit) is proposed."""

    def __init__(self, max_n: int = 3, min_n: int = 1) -> None:
        if not 1 <= min_n <= max_n:
            raise ValueError(f"n-gram sizes need 1 <= min_n <= max_n, got min_n={min_n}, max_n={max_n}")
        self.max_n = max_n
        self.min_n = min_n

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        tokens = list(token_ids)
        if max_tokens <= 0:
            return []
        for n in range(min(self.max_n, len(tokens) - 1), self.min_n - 1, -1):
            start = last_occurrence(tokens, tokens[-n:], before=len(tokens) - n)
            if start is not None:
                follow = start + n
                return tokens[follow:follow + max_tokens]
        return []


def last_occurrence(tokens: list[int], pattern: list[int], before: int) -> int | None:
    """The largest start < before at which pattern occurs in tokens, or None."""
    n = len(pattern)
    first = pattern[0]
    for start in range(before - 1, -1, -1):
        if tokens[start] == first and tokens[start:start + n] == pattern:
            return start
    return None
