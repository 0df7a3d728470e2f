"""Tokenization through the `tokenizers` library, plus the model's chat template
(qwen_serve.checkpoints.chat_template) so a conversation becomes token ids in one call."""
from __future__ import annotations

from functools import cached_property, lru_cache
from typing import Any, Sequence

import tokenizers

from .chat_template import ChatTemplate


@lru_cache(maxsize=1)
def _byte_level_decoding() -> dict[str, int]:
    """GPT-2's byte-level alphabet, reversed: printable stand-in character -> byte value."""
    printable = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    table, shift = {}, 0
    for byte in range(256):
        if byte in printable:
            table[chr(byte)] = byte
        else:
            table[chr(256 + shift)] = byte
            shift += 1
    return table


class Tokenizer:
    """encode/decode plus the model's chat template; special-token handling as in transformers."""

    def __init__(
        self,
        backend: tokenizers.Tokenizer,
        chat_template: str | None = None,
        bos_token: str | None = None,
        eos_token: str | None = None,
    ) -> None:
        self.backend = backend
        self.chat_template = ChatTemplate(chat_template) if chat_template else None
        self.bos_token = bos_token
        self.eos_token = eos_token

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self.backend.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, token_ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(token_ids), skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        return self.backend.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """The exact bytes one token stands for (may be part of a UTF-8 character)."""
        added = self._added_tokens.get(token_id)
        if added is not None:
            return added.encode("utf-8")
        piece = self.backend.id_to_token(token_id)
        if piece is not None and isinstance(self.backend.decoder, tokenizers.decoders.ByteLevel):
            table = _byte_level_decoding()
            if all(ch in table for ch in piece):
                return bytes(table[ch] for ch in piece)
        return self.decode([token_id], skip_special_tokens=False).encode("utf-8")

    @property
    def added_token_ids(self) -> list[int]:
        """The tokens added beside the BPE vocabulary (the chat's <|im_end|>, <think>, <tool_call>, ...)."""
        return sorted(self._added_tokens)

    @cached_property
    def _added_tokens(self) -> dict[int, str]:
        return {i: t.content for i, t in self.backend.get_added_tokens_decoder().items()}

    def render_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **context: Any) -> str:
        if self.chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        context.setdefault("bos_token", self.bos_token or "")
        context.setdefault("eos_token", self.eos_token or "")
        return self.chat_template.render(messages, add_generation_prompt, **context)

    def encode_chat(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **context: Any) -> list[int]:
        # The template already spells out BOS and role markers, so add nothing more.
        return self.encode(self.render_chat(messages, add_generation_prompt, **context), add_special_tokens=False)
