"""Token log-probabilities in OpenAI's two shapes: chat (an entry per token with its bytes and
top alternatives) and legacy completions (parallel lists of tokens, logprobs, top maps and
text offsets)."""
from __future__ import annotations

import codecs
from typing import Any, Sequence

from ..checkpoints.tokenizer import Tokenizer


def _token_info(tokenizer: Tokenizer, token_id: int, logprob: float) -> dict[str, Any]:
    raw = tokenizer.token_bytes(token_id)
    return {"token": raw.decode("utf-8", errors="replace"), "logprob": logprob, "bytes": list(raw)}


def chat_logprob_entry(tokenizer: Tokenizer, token_id: int, logprobs: dict[int, float], k: int) -> dict[str, Any]:
    entry = _token_info(tokenizer, token_id, logprobs.get(token_id, float("-inf")))
    top = sorted(logprobs.items(), key=lambda kv: -kv[1])[:k]
    entry["top_logprobs"] = [_token_info(tokenizer, t, lp) for t, lp in top]
    return entry


def legacy_token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """The token's text, or ``bytes:\\xe2\\x80`` for a piece of a UTF-8 character (as OpenAI)."""
    raw = tokenizer.token_bytes(token_id)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


class LegacyLogprobs:
    """Accumulates one choice's legacy logprobs; text_offset counts characters of the text."""

    def __init__(self, tokenizer: Tokenizer, k: int) -> None:
        self.tokenizer = tokenizer
        self.k = k
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._chars = 0
        self.body: dict[str, list] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}

    def add(self, token_ids: Sequence[int], logprobs: Sequence[dict[int, float] | None]) -> dict[str, list]:
        """Records the tokens; returns the part of the body they make (for a stream chunk)."""
        part: dict[str, list] = {key: [] for key in self.body}
        for token, lps in zip(token_ids, logprobs):
            lps = lps or {}
            top = sorted(lps.items(), key=lambda kv: -kv[1])[:self.k]
            if token not in dict(top) and token in lps:
                top.append((token, lps[token]))
            part["tokens"].append(legacy_token_text(self.tokenizer, token))
            part["token_logprobs"].append(lps.get(token))
            part["top_logprobs"].append({legacy_token_text(self.tokenizer, t): lp for t, lp in top})
            part["text_offset"].append(self._chars)
            self._chars += len(self._utf8.decode(self.tokenizer.token_bytes(token)))
        for key, values in part.items():
            self.body[key].extend(values)
        return part
