"""The engine loop: schedule -> execute -> postprocess, one model call per step."""
from __future__ import annotations

import itertools
import logging
import random
import time
from dataclasses import dataclass, field
from typing import Sequence as Seq

from ..config import EngineConfig, ModelConfig
from ..errors import InvalidRequest
from ..models.tokenizer import Tokenizer
from ..protocols import KVCache, ModelExecutor, PrefixCaching, Sampler
from .detokenizer import IncrementalDetokenizer
from .sampling_params import SamplingParams
from .scheduler import Scheduler
from .sequence import Sequence

log = logging.getLogger("qwen_serve.engine")


@dataclass
class RequestOutput:
    """What a step produced for one request: new tokens and the text they made final."""

    request_id: str
    new_token_ids: list[int]
    new_text: str
    finished: bool
    finish_reason: str | None
    new_logprobs: list[dict[int, float] | None] = field(default_factory=list)
    index: int = 0  # which of the request's n choices (SamplingParams.n) this output belongs to
    num_cached_tokens: int = 0  # prompt tokens served from the prefix cache (set on the final output)


@dataclass
class EngineStats:
    """Counters since start; the server turns them into /metrics."""

    requests_total: int = 0
    prefill_tokens_total: int = 0
    decode_tokens_total: int = 0
    steps_total: int = 0


class Engine:
    def __init__(
        self,
        executor: ModelExecutor,
        cache: KVCache,
        sampler: Sampler,
        tokenizer: Tokenizer,
        config: EngineConfig,
    ) -> None:
        self.executor = executor
        self.cache = cache
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.config = config
        self.model_config: ModelConfig = executor.config
        self.max_seq_len = config.resolved_max_seq_len(self.model_config)
        self.scheduler = Scheduler(cache, config)
        self.sequences: dict[str, Sequence] = {}
        self.stats = EngineStats()
        self._seq_ids = itertools.count()
        self._seed_source = random.Random(config.seed)

    # --- requests -----------------------------------------------------------------------
    def check_request(self, prompt_token_ids: Seq[int], params: SamplingParams) -> list[int]:
        """Validate a request without touching engine state (safe from any thread)."""
        prompt = [int(t) for t in prompt_token_ids]
        if not prompt:
            raise InvalidRequest("the prompt is empty")
        vocab = self.model_config.vocab_size
        if any(t < 0 or t >= vocab for t in prompt):
            raise InvalidRequest(f"prompt token ids must be in [0, {vocab})")
        unimplemented = [name for name, on in (
            ("n > 1", params.n > 1), ("penalties and logit_bias", params.penalized), ("min_p", params.min_p > 0),
            ("stop_token_ids", bool(params.stop_token_ids)), ("min_tokens", params.min_tokens > 0),
            ("structured output", params.structured is not None)) if on]
        if unimplemented:  # fields of the SamplingParams contract that the engine does not act on yet
            raise InvalidRequest(f"not supported yet: {', '.join(unimplemented)}")
        total = len(prompt) + params.max_tokens
        if total > self.max_seq_len or not self.cache.can_fit(total):
            raise InvalidRequest(
                f"prompt ({len(prompt)} tokens) + max_tokens ({params.max_tokens}) = {total} tokens "
                f"exceeds the maximum sequence length of {self.max_seq_len} tokens"
            )
        return prompt

    def check_priority(self, priority: int) -> None:
        """A priority other than 0 means something only under the "priority" policy (as in vLLM)."""
        if isinstance(priority, bool) or not isinstance(priority, int):
            raise InvalidRequest("'priority' must be an integer", param="priority")
        if priority != 0 and self.config.scheduling_policy != "priority":
            raise InvalidRequest(f"'priority' {priority} needs the priority scheduling policy "
                                 "(this server schedules first come, first served)", param="priority")

    def add_request(self, request_id: str, prompt_token_ids: Seq[int], params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0) -> Sequence:
        prompt = self.check_request(prompt_token_ids, params)
        self.check_priority(priority)
        if request_id in self.sequences:
            raise InvalidRequest(f"request id {request_id!r} is already running")
        seed = params.seed if params.seed is not None else self._seed_source.getrandbits(63)
        seq = Sequence(
            seq_id=next(self._seq_ids),
            request_id=request_id,
            prompt_token_ids=prompt,
            params=params,
            generator=self.sampler.make_generator(seed),
            detokenizer=IncrementalDetokenizer(self.tokenizer.decode, params.stop),
            priority=priority,
        )
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        self.sequences[request_id] = seq
        self.scheduler.add(seq)
        self.stats.requests_total += 1
        return seq

    def run(self, requests: Seq[tuple[str, Seq[int], SamplingParams]]) -> list[Sequence]:
        """Add the requests and step until all of them finish (the offline, blocking path). On
        an error the ones still running are aborted, so their KV blocks go back to the pool."""
        seqs: list[Sequence] = []
        try:
            for request_id, tokens, params in requests:
                seqs.append(self.add_request(request_id, tokens, params))
            while any(not s.is_finished for s in seqs):
                self.step()
        finally:
            for seq in seqs:
                if not seq.is_finished:
                    self.abort(seq.request_id)
        return seqs

    def abort(self, request_id: str) -> bool:
        """Cancel a request; its blocks return to the pool at once."""
        seq = self.sequences.pop(request_id, None)
        if seq is None:
            return False
        self.scheduler.finish(seq, "abort")
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # --- the loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch.chunks:
            return []
        logits = self.executor.execute(batch, self.cache)
        by_id = {s.seq_id: s for s in self.scheduler.running}
        sampled = [by_id[c.seq_id] for c in batch.chunks if c.sample]
        tokens, logprobs = self._sample(logits, sampled)
        self.stats.steps_total += 1

        for chunk in batch.chunks:
            seq = by_id[chunk.seq_id]
            seq.num_computed += len(chunk.token_ids)
            if seq.num_computed <= len(seq.prompt_token_ids):
                self.stats.prefill_tokens_total += len(chunk.token_ids)
            else:
                self.stats.decode_tokens_total += len(chunk.token_ids)
            if isinstance(self.cache, PrefixCaching):
                self.cache.publish(seq.seq_id, seq.token_ids(), seq.num_computed)

        outputs = []
        now = time.monotonic()
        for seq, token, lp in zip(sampled, tokens, logprobs):
            if token is None:  # this request's sampling failed; the others go on
                self.scheduler.finish(seq, "error")
                self.sequences.pop(seq.request_id, None)
                outputs.append(RequestOutput(seq.request_id, [], seq.detokenizer.release(final=True), True, "error"))
            else:
                outputs.append(self._append_token(seq, token, lp, now))
        return outputs

    def _sample(self, logits, sampled: list[Sequence]) -> tuple[list[int | None], list[dict[int, float] | None]]:
        """All rows at once; if that raises, row by row so one bad request fails alone."""
        try:
            result = self.sampler.sample(logits, [s.params for s in sampled], [s.generator for s in sampled])
            return list(result.token_ids), list(result.logprobs or [None] * len(sampled))
        except Exception:
            log.exception("sampling a batch of %d rows failed; retrying row by row", len(sampled))
        tokens: list[int | None] = []
        logprobs: list[dict[int, float] | None] = []
        for i, seq in enumerate(sampled):
            try:
                result = self.sampler.sample(logits[i:i + 1], [seq.params], [seq.generator])
                tokens.append(result.token_ids[0])
                logprobs.append(result.logprobs[0] if result.logprobs else None)
            except Exception:
                log.exception("sampling failed for request %s", seq.request_id)
                tokens.append(None)
                logprobs.append(None)
        return tokens, logprobs

    def _append_token(self, seq: Sequence, token: int, logprobs: dict[int, float] | None, now: float) -> RequestOutput:
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.output_token_ids.append(token)
        seq.output_logprobs.append(logprobs)
        reason = None
        if token in self.model_config.eos_token_ids and not seq.params.ignore_eos:
            reason = "stop"
        else:
            seq.detokenizer.add(token)
            if seq.detokenizer.stopped_by is not None:
                reason = "stop"
            elif len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_seq_len:
                reason = "length"
        if reason is not None:
            self.scheduler.finish(seq, reason)
            self.sequences.pop(seq.request_id, None)
        text = seq.detokenizer.release(final=reason is not None)
        return RequestOutput(seq.request_id, [token], text, reason is not None, reason, [logprobs],
                             num_cached_tokens=seq.num_cached_prompt_tokens)
