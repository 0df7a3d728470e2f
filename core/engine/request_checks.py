"""A request checked against what the engine can do, before anything is queued or sent: prompt
ids within the vocabulary, prompt + max_tokens within the sequence limit and the KV pool (n
choices' blocks too), the logits processors' fields, a priority the policy takes. Safe from any
thread: it reads only what never changes after start."""
from __future__ import annotations

from typing import Sequence as Seq

from ..errors import InvalidRequest
from ..logits.pipeline import LogitsPipeline
from ..models.config import ModelConfig
from ..protocols import KVCache
from ..sampling.params import SamplingParams
from .choices import blocks_for_choices


class RequestChecks:
    def __init__(self, task: str, model_config: ModelConfig, cache: KVCache, max_seq_len: int, logits: LogitsPipeline,
                 scheduling_policy: str) -> None:
        self.task = task
        self.model_config = model_config
        self.cache = cache
        self.max_seq_len = max_seq_len
        self.logits = logits
        self.scheduling_policy = scheduling_policy

    def check_request(self, prompt_token_ids: Seq[int], params: SamplingParams) -> list[int]:
        """Validate a request without touching engine state (safe from any thread)."""
        if self.task != "generate":
            raise InvalidRequest(f"this server runs --task {self.task}: it does not generate text")
        prompt = self._checked_tokens(prompt_token_ids)
        total = len(prompt) + params.max_tokens
        if total > self.max_seq_len or not self.cache.can_fit(total):
            raise InvalidRequest(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = {total} tokens "
                f"exceeds the maximum sequence length of {self.max_seq_len} tokens"
            )
        if params.n > 1:
            blocks = blocks_for_choices(len(prompt), params.max_tokens, params.n, self.cache.block_size)
            if not self.cache.can_fit(blocks * self.cache.block_size):
                raise InvalidRequest(
                    f"n = {params.n} choices of prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) "
                    f"need {blocks} KV blocks of {self.cache.block_size} tokens, more than the pool holds",
                    param="n")
        self.logits.validate(params)
        return prompt

    def check_pooling(self, prompt_token_ids: Seq[int]) -> list[int]:
        """Validate an input to embed or score, as check_request does a prompt."""
        if self.task == "generate":
            raise InvalidRequest("this server generates text (--task generate); embeddings and scores need a "
                                 "server started with --task embed or --task rerank")
        prompt = self._checked_tokens(prompt_token_ids)
        if len(prompt) > self.max_seq_len or not self.cache.can_fit(len(prompt) + 1):
            raise InvalidRequest(f"the input ({len(prompt)} tokens) exceeds the maximum of {self.max_seq_len} tokens")
        return prompt

    def _checked_tokens(self, token_ids: Seq[int]) -> list[int]:
        prompt = [int(t) for t in token_ids]
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        vocab = self.model_config.vocab_size
        if any(t < 0 or t >= vocab for t in prompt):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})")
        return prompt

    def check_priority(self, priority: int) -> None:
        """A priority other than 0 means something only under the "priority" policy (as in vLLM)."""
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequest("'priority' must be an integer", param="priority")
        if priority != 0 and self.scheduling_policy != "priority":
            raise InvalidRequest(f"'priority' {priority} needs the priority scheduling policy "
                                 "(this server schedules first come, first served)", param="priority")
