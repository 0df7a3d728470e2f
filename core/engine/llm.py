"""The offline, vLLM-shaped Python API: LLM(...).generate / .chat."""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from ..registry import Registry
from .builder import EngineParts, build_engine
from .sampling_params import SamplingParams


@dataclass
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[dict[int, float] | None] | None = None
    index: int = 0  # which of the prompt's n choices (SamplingParams.n)


class LLM:
    """Load a model and run batches of prompts through the continuous-batching engine."""

    def __init__(
        self,
        model: str | None = None,
        backend: str = "torch",
        kv_cache: str = "paged",
        dtype: str = "float32",
        quant: str = "none",
        env: Mapping[str, str] | None = None,
        registry: Registry | None = None,
        **engine_options: Any,
    ) -> None:
        parts: EngineParts = build_engine(model, backend, kv_cache, dtype, quant, env=env, registry=registry,
                                          **engine_options)
        self.parts = parts
        self.engine = parts.engine
        self.tokenizer = parts.tokenizer
        self.config = parts.model_config
        self._ids = itertools.count()

    def generate(self, prompts: Sequence[str | Sequence[int]] | str, params: SamplingParams | None = None) -> list[CompletionOutput]:
        """One CompletionOutput per choice, prompt by prompt and each prompt's n choices in index
        order: len(prompts) * params.n outputs (one per prompt for the default n = 1)."""
        if isinstance(prompts, str):
            prompts = [prompts]
        token_lists = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        return self._run(token_lists, params or SamplingParams())

    def chat(self, conversations: Sequence[Sequence[Mapping[str, Any]]], params: SamplingParams | None = None,
             **template_context: Any) -> list[CompletionOutput]:
        """Shaped as generate's result: n outputs per conversation."""
        if conversations and isinstance(conversations[0], Mapping):
            conversations = [conversations]  # a single conversation
        token_lists = [self.tokenizer.encode_chat(list(c), **template_context) for c in conversations]
        return self._run(token_lists, params or SamplingParams())

    def _run(self, token_lists: list[list[int]], params: SamplingParams) -> list[CompletionOutput]:
        seqs = self.engine.run([(f"offline-{next(self._ids)}", tokens, params) for tokens in token_lists])
        return [
            CompletionOutput(
                request_id=s.request_id,
                prompt_token_ids=s.prompt_token_ids,
                token_ids=list(s.output_token_ids),
                text=s.detokenizer.text,
                finish_reason=s.finish_reason,
                logprobs=list(s.output_logprobs) if params.logprobs is not None else None,
                index=s.index,
            )
            for s in seqs
        ]
