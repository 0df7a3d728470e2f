"""Prompts of an exact token length, a new one for every request (so no request hits a prefix
cache that an earlier one filled).

- Token ids, for servers whose /v1/completions takes a list of ids: random ids from a range
  of ordinary tokens; exact by construction.
- Text, for chat endpoints: words that are one token each in the served tokenizer (" apple"),
  which the pre-tokenizer never merges, so n words are n tokens; the chat template's own
  tokens are measured once against the server's usage.prompt_tokens and subtracted.
Both are checked against usage.prompt_tokens on every request (RequestRecord.prompt_tokens).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Protocol

import numpy as np

WORD = re.compile(r"^ [a-z]{3,10}$")
ORDINARY_IDS = (100, 30000)  # below every vocabulary's special tokens (SmolLM2 49152, Qwen 151643)


class TextTokenizer(Protocol):
    def encode(self, text: str, add_special_tokens: bool = ...) -> list[int]: ...
    def decode(self, token_ids: list[int], skip_special_tokens: bool = ...) -> str: ...
    @property
    def vocab_size(self) -> int: ...


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """A tokenizer.json, an HF checkpoint directory or a .gguf file."""
    import tokenizers

    from ..checkpoints.checkpoint import load_checkpoint
    from ..checkpoints.tokenizer import Tokenizer

    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".json":
        return Tokenizer(tokenizers.Tokenizer.from_file(str(p)))
    return load_checkpoint(p).tokenizer


class TokenIdPrompts:
    def __init__(self, seed: int, low: int = ORDINARY_IDS[0], high: int = ORDINARY_IDS[1]) -> None:
        self.rng = np.random.default_rng(seed)
        self.low, self.high = low, high

    def make(self, n: int) -> list[int]:
        return self.rng.integers(self.low, self.high, size=n).tolist()


class WordPrompts:
    """Space-separated lowercase words, each exactly one token of `tokenizer`."""

    def __init__(self, tokenizer: TextTokenizer, seed: int, pool_size: int = 4000) -> None:
        self.tokenizer = tokenizer
        self.rng = np.random.default_rng(seed)
        self.words = single_token_words(tokenizer, pool_size)
        if len(self.words) < 100:
            raise ValueError(f"the tokenizer has only {len(self.words)} single-token words; need at least 100")

    def make(self, n: int) -> str:
        for _ in range(10):
            text = "".join(self.words[i] for i in self.rng.integers(0, len(self.words), size=n))
            if len(self.tokenizer.encode(text, add_special_tokens=False)) == n:
                return text
        raise ValueError(f"could not build a text of exactly {n} tokens")


def single_token_words(tokenizer: TextTokenizer, limit: int) -> list[str]:
    words = []
    for token_id in range(min(tokenizer.vocab_size, 60000)):
        text = tokenizer.decode([token_id])
        if WORD.match(text) and tokenizer.encode(text, add_special_tokens=False) == [token_id]:
            words.append(text)
            if len(words) >= limit:
                break
    return words
