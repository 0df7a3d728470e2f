"""Structured output (json_object, json_schema, tool_calls) as a per-step token mask from llguidance.

llguidance was measured against xgrammar on this machine (benchmarks/bench_grammar.py): it
compiles a schema in under a millisecond (xgrammar: 2-10 ms, paid before a request's first
token), computes a mask in about 10 us (both far below a decode step), names what it cannot
compile ('Unimplemented keys: ["uniqueItems"]'), and imports no torch, so it lives in the core
and serves every backend. A request's matcher is built from its tokens only, so preemption never
disturbs it; each choice of n has its own.
"""
from __future__ import annotations

import threading
from typing import Any

import numpy as np

from ..checkpoints.tokenizer import Tokenizer
from ..errors import InvalidRequest
from ..models.config import ModelConfig
from ..protocols import LogitsRequest
from ..sampling.adjustment import LogitsAdjustment
from ..sampling.params import SamplingParams, StructuredOutput
from .grammars import grammar_for


def _import_llguidance() -> Any:
    try:
        import llguidance
    except ImportError:
        raise InvalidRequest("structured output needs the llguidance package (pip install llguidance)") from None
    return llguidance


class StructuredOutputs:
    """The grammar processor: applies to requests whose params carry ``structured``."""

    def __init__(self, model_config: ModelConfig, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = max(model_config.vocab_size, tokenizer.vocab_size)
        self.eos_token_ids = list(model_config.eos_token_ids)
        self._lock = threading.Lock()
        self._ll_tokenizer: Any = None  # built on first use: 0.2-0.6 s for a 50k-150k vocabulary
        self._grammars: dict[StructuredOutput, str] = {}

    def validate(self, params: SamplingParams) -> None:
        if params.structured is not None:
            self._grammar(params.structured)

    def start(self, request: LogitsRequest) -> "GrammarState | None":
        structured = request.params.structured
        if structured is None:
            return None
        llguidance = _import_llguidance()
        matcher = llguidance.LLMatcher(self._library_tokenizer(), self._grammar(structured), log_level=0)
        return GrammarState(matcher, structured.after_token_id, self.vocab_size)

    def _library_tokenizer(self) -> Any:
        with self._lock:
            if self._ll_tokenizer is None:
                llguidance = _import_llguidance()
                self._ll_tokenizer = llguidance.LLTokenizer(
                    self.tokenizer.backend.to_str(), n_vocab=self.vocab_size, eos_token=self.eos_token_ids or None)
            return self._ll_tokenizer

    def _grammar(self, structured: StructuredOutput) -> str:
        """Compiled once per distinct constraint (the same schema is usually sent again and again)."""
        with self._lock:
            grammar = self._grammars.get(structured)
        if grammar is not None:
            return grammar
        llguidance = _import_llguidance()
        ll_tokenizer = self._library_tokenizer()

        def validate(text: str) -> str | None:
            failed, messages = llguidance.LLMatcher.validate_grammar_with_warnings(text, ll_tokenizer)
            return messages[0] if failed else None

        grammar = grammar_for(structured, llguidance, validate, self._single_token)
        with self._lock:
            if len(self._grammars) >= 256:
                self._grammars.pop(next(iter(self._grammars)))
            self._grammars[structured] = grammar
        return grammar

    def _single_token(self, text: str) -> int | None:
        ids = self.tokenizer.encode(text, add_special_tokens=False)
        return ids[0] if len(ids) == 1 else None


class GrammarState:
    """One request's matcher; idle until ``after_token_id`` was generated, if one is set."""

    def __init__(self, matcher: Any, after_token_id: int | None, vocab_size: int) -> None:
        if matcher.is_error():
            raise InvalidRequest(f"structured output: {matcher.get_error()}")
        self.matcher = matcher
        self.waiting_for = after_token_id
        self.words = -(-vocab_size // 32)

    def adjust(self, request: LogitsRequest) -> LogitsAdjustment | None:
        if self.waiting_for is not None:
            return None
        mask = np.empty(self.words, dtype=np.int32)
        self.matcher.unsafe_compute_mask_ptr(mask.ctypes.data, mask.nbytes)
        if self.matcher.is_error():
            raise RuntimeError(f"grammar matcher failed: {self.matcher.get_error()}")
        return LogitsAdjustment(allowed=mask)

    def accept(self, token_id: int) -> None:
        if self.waiting_for is not None:
            if token_id == self.waiting_for:
                self.waiting_for = None
            return
        if not self.matcher.consume_token(token_id):
            raise RuntimeError(f"token {token_id} breaks the grammar: {self.matcher.get_error()}")

    def is_complete(self) -> bool:
        return self.waiting_for is None and self.matcher.is_stopped()
