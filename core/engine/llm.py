"""The offline, vLLM-shaped Python API: LLM(...).generate / .chat (and .embed / .score with task
"embed" / "rerank").

``chat`` renders and parses through the same ChatFormat as the HTTP server
(qwen_serve.chat.format): tools and template arguments reach the template, and each
output's ``message`` holds the reply split into reasoning, content and tool calls.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from ..registry import Registry
from ..sampling.params import SamplingParams
from .builder import EngineParts, build_engine

if TYPE_CHECKING:
    import numpy as np

    from ..chat.format import ChatFormat
    from ..chat.output_parser import ChatMessage


@dataclass
class CompletionOutput:
    request_id: str
    prompt_token_ids: list[int]
    token_ids: list[int]
    text: str
    finish_reason: str | None
    logprobs: list[dict[int, float] | None] | None = None
    message: "ChatMessage | None" = None  # from LLM.chat: reasoning_content, content, tool_calls
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
        reasoning_parser: str | None = None,
        tool_call_parser: str | None = None,
        **engine_options: Any,
    ) -> None:
        parts: EngineParts = build_engine(model, backend, kv_cache, dtype, quant, env=env, registry=registry,
                                          **engine_options)
        self.parts = parts
        self.engine = parts.engine
        self.tokenizer = parts.tokenizer
        self.config = parts.model_config
        self._ids = itertools.count()
        self._parser_names = (reasoning_parser, tool_call_parser)

    @cached_property
    def chat_format(self) -> "ChatFormat":
        from ..chat.format import ChatFormat

        return ChatFormat(self.tokenizer, *self._parser_names)

    def generate(self, prompts: Sequence[str | Sequence[int]] | str,
                 params: SamplingParams | Sequence[SamplingParams] | None = None) -> list[CompletionOutput]:
        """One CompletionOutput per choice, prompt by prompt and each prompt's n choices in index
        order: the sum of each prompt's n outputs (one per prompt for the default n = 1). params may
        be one per prompt (as vLLM's), all run in the same batches."""
        if isinstance(prompts, str):
            prompts = [prompts]
        token_lists = [self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in prompts]
        return self._run(token_lists, SamplingParams() if params is None else params)

    def chat(self, conversations: Sequence[Sequence[Mapping[str, Any]]], params: SamplingParams | None = None,
             tools: Sequence[Mapping[str, Any]] | None = None, chat_template_kwargs: Mapping[str, Any] | None = None,
             **template_context: Any) -> list[CompletionOutput]:
        """Conversations and tools in the OpenAI request shapes (validated the same way: a bad
        one raises InvalidRequest); keyword arguments also reach the template. Shaped as
        generate's result: n outputs per conversation."""
        from ..chat.messages import parse_messages
        from ..chat.tools import parse_tools

        if conversations and isinstance(conversations[0], Mapping):
            conversations = [conversations]  # a single conversation
        offered = parse_tools(None if tools is None else list(tools))
        kwargs = {**template_context, **(chat_template_kwargs or {})}
        rendered = [self.chat_format.render(parse_messages(list(c)), offered, template_kwargs=kwargs)
                    for c in conversations]
        outputs = self._run([r.token_ids for r in rendered], SamplingParams() if params is None else params)
        by_prompt = {tuple(r.token_ids): r for r in rendered}  # outputs may be several per prompt (n)
        for out in outputs:
            out.message = self.chat_format.output_parser(by_prompt[tuple(out.prompt_token_ids)]).parse(out.text)
        return outputs

    def embed(self, inputs: Sequence[str | Sequence[int]] | str, dimensions: int | None = None) -> list["np.ndarray"]:
        """An engine built with task="embed": each input's embedding (the last token's final hidden
        state, L2-normalised; cut to ``dimensions`` first, for a model trained for it), as
        /v1/embeddings returns it. Texts are tokenized with the tokenizer's special tokens."""
        from ..pooling.vectors import checked_dimensions, normalized

        if isinstance(inputs, str):
            inputs = [inputs]
        width = checked_dimensions(dimensions, self.config)
        seqs = self._pool([self.tokenizer.encode(p) if isinstance(p, str) else list(p) for p in inputs])
        return [normalized(s.pooled, width) for s in seqs]

    def score(self, query: str, documents: Sequence[str], instruction: str | None = None) -> list[float]:
        """An engine built with task="rerank": each document's relevance to the query (Qwen3-Reranker's
        P(yes)), as /v1/score returns it."""
        from ..pooling.reranker import RerankPrompt, relevance

        prompt = RerankPrompt(self.tokenizer)
        seqs = self._pool([prompt.tokens(query, document, instruction) for document in documents])
        return [relevance(s.pooled) for s in seqs]

    def _pool(self, token_lists: list[list[int]]) -> list:
        return self.engine.run_pooling([(f"offline-{next(self._ids)}", tokens) for tokens in token_lists])

    def _run(self, token_lists: list[list[int]],
             params: SamplingParams | Sequence[SamplingParams]) -> list[CompletionOutput]:
        per_prompt = [params] * len(token_lists) if isinstance(params, SamplingParams) else list(params)
        if len(per_prompt) != len(token_lists):
            raise ValueError(f"{len(per_prompt)} SamplingParams for {len(token_lists)} prompts")
        seqs = self.engine.run([(f"offline-{next(self._ids)}", tokens, p) for tokens, p in zip(token_lists, per_prompt)])
        return [
            CompletionOutput(
                request_id=s.request_id,
                prompt_token_ids=s.prompt_token_ids,
                token_ids=list(s.output_token_ids),
                text=s.detokenizer.text,
                finish_reason=s.finish_reason,
                logprobs=list(s.output_logprobs) if s.params.logprobs is not None else None,
                index=s.index,
            )
            for s in seqs
        ]
