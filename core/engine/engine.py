"""The engine loop: schedule -> execute -> postprocess, one model call per step."""
from __future__ import annotations

import itertools
import logging
import random
import time
from typing import Iterable
from typing import Sequence as Seq

from ..checkpoints.tokenizer import Tokenizer
from ..config import EngineConfig
from ..errors import InvalidRequest, ModelLoadError
from ..logits.pipeline import LogitsPipeline
from ..logits.plugin import builtin_logits_processors
from ..models.config import ModelConfig
from ..pooling.reranker import verdict_token_ids
from ..protocols import (
    Forking,
    KVCache,
    LogitsProcessor,
    ModelExecutor,
    Pools,
    PrefixCaching,
    Proposer,
    Rewinding,
    Sampler,
    StepBatch,
)
from ..sampling.params import SamplingParams
from . import verification
from .detokenizer import IncrementalDetokenizer
from .drafting import Drafter
from .outputs import RequestOutput, merged_outputs
from .request_checks import RequestChecks
from .scheduler import Scheduler
from .sequence import Sequence
from .stats import EngineStats
from .step_sampler import StepSampler

log = logging.getLogger("qwen_serve.engine")
POOLING = SamplingParams(max_tokens=1, temperature=0.0)  # a pooling sequence's: room for its prompt, nothing sampled


class Engine:
    def __init__(
        self,
        executor: ModelExecutor,
        cache: KVCache,
        sampler: Sampler,
        tokenizer: Tokenizer,
        config: EngineConfig,
        logits_processors: Seq[LogitsProcessor] | None = None,
        proposer: Proposer | None = None,
    ) -> None:
        """logits_processors: None means the built-in ones (penalties, logit_bias, min_tokens,
        structured output); the builder passes every registered one. proposer: what
        config.speculative names (the builder finds it among the registered proposers, e.g. the
        bundled ngram plugin). A cache that cannot rewind runs without speculation."""
        self.executor = executor
        self.cache = cache
        self.sampler = sampler
        self.tokenizer = tokenizer
        self.config = config
        self.model_config: ModelConfig = executor.config
        self.max_seq_len = config.resolved_max_seq_len(self.model_config)
        self.drafter = None
        if config.speculative is not None and proposer is None:
            raise ValueError(f"speculative {config.speculative!r} needs its proposer (build_engine finds it "
                             "among the registered proposers)")
        if config.speculative is not None and isinstance(cache, Rewinding):
            self.drafter = Drafter(proposer, config.num_speculative_tokens, sampler)
        elif config.speculative is not None:
            log.warning("KV cache %s cannot rewind: speculative decoding is off", type(cache).__name__)
        self.scheduler = Scheduler(cache, config, self.drafter)
        if logits_processors is None:
            logits_processors = builtin_logits_processors(self.model_config, tokenizer)
        self.logits = LogitsPipeline(logits_processors)
        self.step_sampler = StepSampler(sampler, self.logits)
        self.sequences: dict[str, list[Sequence]] = {}  # request id -> its choices, until all finish
        self.task = config.task
        if self.task != "generate" and not isinstance(executor, Pools):
            raise ModelLoadError(f"--task {self.task} needs an executor that pools; {type(executor).__name__} does not")
        # what a pooling step reads: the hidden state (embed), or a reranker's "no"/"yes" logits
        self.pooled_logit_ids = verdict_token_ids(tokenizer) if self.task == "rerank" else None
        self.checks = RequestChecks(self.task, self.model_config, cache, self.max_seq_len, self.logits,
                                    config.scheduling_policy)
        self.stats = EngineStats()
        self._seq_ids = itertools.count()
        self._seed_source = random.Random(config.seed)

    # --- requests -----------------------------------------------------------------------
    def check_request(self, prompt_token_ids: Seq[int], params: SamplingParams) -> list[int]:
        """Validate a request without touching engine state (safe from any thread)."""
        return self.checks.check_request(prompt_token_ids, params)

    def check_pooling(self, prompt_token_ids: Seq[int]) -> list[int]:
        return self.checks.check_pooling(prompt_token_ids)

    def check_priority(self, priority: int) -> None:
        self.checks.check_priority(priority)

    def add_request(self, request_id: str, prompt_token_ids: Seq[int], params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0) -> Sequence:
        """Queue a request; returns its first choice (all n: ``add_choices``)."""
        return self.add_choices(request_id, prompt_token_ids, params, arrival_time, priority)[0]

    def add_choices(self, request_id: str, prompt_token_ids: Seq[int], params: SamplingParams,
                    arrival_time: float | None = None, priority: int = 0) -> list[Sequence]:
        """Queue a request as its n choices. Choice i draws from seed + i (a fresh seed when none
        is given), so with a seed it equals a single request with seed + i. Where the cache can
        fork and the n fit in one batch, choice 0 prefills the prompt alone and the others fork
        its blocks once it is computed; otherwise each choice is an independent sequence."""
        prompt = self.check_request(prompt_token_ids, params)
        self.check_priority(priority)
        if request_id in self.sequences:
            raise InvalidRequest(f"request id {request_id!r} is already running")
        seed = params.seed if params.seed is not None else self._seed_source.getrandbits(63)
        choices = []
        for index in range(params.n):
            seq = Sequence(
                seq_id=next(self._seq_ids),
                request_id=request_id,
                prompt_token_ids=prompt,
                params=params,
                generator=self.sampler.make_generator(seed + index),
                detokenizer=IncrementalDetokenizer(self.tokenizer.decode, params.stop, params.min_tokens),
                index=index,
                priority=priority,
            )
            if arrival_time is not None:
                seq.arrival_time = arrival_time
            seq.logits_states = self.logits.start(seq)
            choices.append(seq)
        self.sequences[request_id] = choices
        if params.n > 1 and isinstance(self.cache, Forking) and params.n <= self.config.max_batch:
            choices[0].forks = choices[1:]
            self.scheduler.add(choices[0])
        else:
            for seq in choices:
                self.scheduler.add(seq)
        self.stats.requests_total += 1
        return choices

    def add_pooling(self, request_id: str, prompt_token_ids: Seq[int], arrival_time: float | None = None) -> Sequence:
        """Queue an input to embed or score: it is prefilled like any prompt (chunked, batched,
        prefix hits used and published) and retires after its last chunk with the pooled row
        (RequestOutput.pooled); its blocks go back to the pool then."""
        prompt = self.check_pooling(prompt_token_ids)
        if request_id in self.sequences:
            raise InvalidRequest(f"request id {request_id!r} is already running")
        seq = Sequence(seq_id=next(self._seq_ids), request_id=request_id, prompt_token_ids=prompt,
                       params=POOLING, generator=None,
                       detokenizer=IncrementalDetokenizer(self.tokenizer.decode, (), 0))
        if arrival_time is not None:
            seq.arrival_time = arrival_time
        self.sequences[request_id] = [seq]
        self.scheduler.add(seq)
        self.stats.requests_total += 1
        return seq

    def run(self, requests: Seq[tuple[str, Seq[int], SamplingParams]]) -> list[Sequence]:
        """Add the requests and step until all of them finish (the offline, blocking path). On
        an error the ones still running are aborted, so their KV blocks go back to the pool."""
        return self._run_to_end(self.add_choices(request_id, tokens, params) for request_id, tokens, params in requests)

    def run_pooling(self, requests: Seq[tuple[str, Seq[int]]]) -> list[Sequence]:
        """``run`` for inputs to embed or score: each sequence's ``pooled`` row once all are done."""
        return self._run_to_end([self.add_pooling(request_id, tokens)] for request_id, tokens in requests)

    def _run_to_end(self, additions: Iterable[list[Sequence]]) -> list[Sequence]:
        seqs: list[Sequence] = []
        try:
            for added in additions:
                seqs.extend(added)
            while any(not s.is_finished for s in seqs):
                self.step()
        finally:
            for seq in seqs:
                if not seq.is_finished:
                    self.abort(seq.request_id)
        return seqs

    def abort(self, request_id: str) -> bool:
        """Cancel a request, every choice of it; their blocks return to the pool at once."""
        choices = self.sequences.pop(request_id, None)
        if choices is None:
            return False
        for seq in choices:
            if not seq.is_finished:
                self.scheduler.finish(seq, "abort")
        return True

    def has_unfinished(self) -> bool:
        return self.scheduler.has_work()

    # --- the loop -----------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        batch = self.scheduler.schedule()
        if not batch.chunks:
            return []
        if self.task != "generate":
            return self._pooling_step(batch)
        logits = self.executor.execute(batch, self.cache)
        by_id = {s.seq_id: s for s in self.scheduler.running}
        sampled_chunks = [c for c in batch.chunks if c.sample]
        sampled = [by_id[c.seq_id] for c in sampled_chunks]
        if any(c.num_draft for c in sampled_chunks):
            drawn = verification.draw(self.step_sampler, self.sampler, logits, list(zip(sampled, sampled_chunks)))
        else:
            tokens, logprobs = self.step_sampler.sample(logits, sampled)
            drawn = [([t], [lp]) for t, lp in zip(tokens, logprobs)]
        self._advance(batch, by_id)
        outputs = []
        now = time.monotonic()
        row = 0
        for seq, chunk, (tokens, logprobs) in zip(sampled, sampled_chunks, drawn):
            forked = self._fork_choices(seq, logits[row:row + 1]) if seq.forks else []
            row += 1 + chunk.num_draft
            if chunk.num_draft:
                outputs.append(self._postprocess_verified(seq, chunk.num_draft, tokens, now))
                continue
            outputs.append(self._postprocess(seq, tokens[0], logprobs[0], now))
            outputs.extend(self._postprocess(child, t, c_lp, now) for child, t, c_lp in forked)
        if self.drafter is not None and self.drafter.from_hidden_states:
            self.drafter.after_step(self.executor, self.cache,
                                    [(i, chunk, by_id[chunk.seq_id]) for i, chunk in enumerate(batch.chunks)])
        return outputs

    def _advance(self, batch: StepBatch, by_id: dict[int, Sequence]) -> None:
        """The step's chunks are computed: count them and publish their full blocks."""
        self.stats.steps_total += 1
        for chunk in batch.chunks:
            seq = by_id[chunk.seq_id]
            computed = len(chunk.token_ids) - chunk.num_draft  # drafts count once kept
            seq.num_computed += computed
            if seq.num_computed <= len(seq.prompt_token_ids):
                self.stats.prefill_tokens_total += computed
            else:
                self.stats.decode_tokens_total += computed
            if isinstance(self.cache, PrefixCaching):
                self.cache.publish(seq.seq_id, seq.token_ids(), seq.num_computed)

    def _pooling_step(self, batch: StepBatch) -> list[RequestOutput]:
        """Prefill chunks only; a sequence whose last chunk ran retires with its pooled row."""
        rows = self.executor.pool(batch, self.cache, self.pooled_logit_ids)
        by_id = {s.seq_id: s for s in self.scheduler.running}
        self._advance(batch, by_id)
        outputs = []
        for chunk, row in zip([c for c in batch.chunks if c.sample], rows):
            seq = by_id[chunk.seq_id]
            seq.pooled = row
            self._retire(seq, "stop")
            outputs.append(RequestOutput(seq.request_id, [], "", True, "stop",
                                         num_cached_tokens=seq.num_cached_prompt_tokens, pooled=row))
        return outputs

    def _postprocess_verified(self, seq: Sequence, num_draft: int, tokens: list[int | None], now: float) -> RequestOutput:
        """Append a verified chunk's tokens one by one, as decoding would (an EOS or a stop among
        them ends the request right there), then keep the accepted drafts' positions in the KV
        cache and rewind the rejected ones."""
        kept = len(tokens) - 1  # accepted drafts; their keys/values were computed in this step
        self.stats.draft_tokens_total += num_draft
        self.stats.accepted_draft_tokens_total += kept
        merged: RequestOutput | None = None
        for token in tokens:
            out = self._postprocess(seq, token, None, now)
            merged = out if merged is None else merged_outputs(merged, out)
            if seq.is_finished:
                return merged
        seq.num_computed += kept
        self.stats.decode_tokens_total += kept
        self.cache.rewind(seq.seq_id, seq.num_computed)
        if isinstance(self.cache, PrefixCaching):
            self.cache.publish(seq.seq_id, seq.token_ids(), seq.num_computed)
        return merged

    def _fork_choices(self, seq: Sequence, row_logits) -> list[tuple[Sequence, int | None, dict | None]]:
        """seq's prompt is computed: its other choices share its blocks (copy-on-write) and draw
        their first tokens from the same logits, each with its own generator and processors."""
        children, seq.forks = seq.forks, []
        drawn = []
        for child in children:
            self.cache.fork(seq.seq_id, child.seq_id)
            child.num_computed = seq.num_computed
            child.num_cached_prompt_tokens = seq.num_cached_prompt_tokens
            self.scheduler.adopt(child)
            tokens, logprobs = self.step_sampler.sample(row_logits, [child])
            drawn.append((child, tokens[0], logprobs[0]))
        return drawn

    def _postprocess(self, seq: Sequence, token: int | None, logprobs: dict[int, float] | None,
                     now: float) -> RequestOutput:
        if token is None:  # this request's sampling failed; the others go on
            self._retire(seq, "error")
            return RequestOutput(seq.request_id, [], seq.detokenizer.release(final=True), True, "error",
                                 index=seq.index)
        return self._append_token(seq, token, logprobs, now)

    def _retire(self, seq: Sequence, reason: str) -> None:
        self.scheduler.finish(seq, reason)
        choices = self.sequences.get(seq.request_id)
        if choices is not None and all(s.is_finished for s in choices):
            del self.sequences[seq.request_id]

    def _append_token(self, seq: Sequence, token: int, logprobs: dict[int, float] | None, now: float) -> RequestOutput:
        if seq.first_token_time is None:
            seq.first_token_time = now
        seq.output_token_ids.append(token)
        seq.output_logprobs.append(logprobs)
        reason, stop_reason = None, None
        verdict = self._advance_logits_states(seq, token)
        if verdict == "error":
            reason = "error"
        elif (token in self.model_config.eos_token_ids and not seq.params.ignore_eos) or token in seq.params.stop_token_ids:
            reason = "stop"  # the token ends the text without being part of it
            stop_reason = token if token in seq.params.stop_token_ids else None
        else:
            seq.detokenizer.add(token)
            if seq.detokenizer.stopped_by is not None or verdict == "complete":
                reason, stop_reason = "stop", seq.detokenizer.stopped_by
            elif len(seq.output_token_ids) >= seq.params.max_tokens or seq.num_tokens >= self.max_seq_len:
                reason = "length"
        if reason is not None:
            self._retire(seq, reason)
        text = seq.detokenizer.release(final=reason is not None)
        return RequestOutput(seq.request_id, [token], text, reason is not None, reason, [logprobs],
                             index=seq.index, num_cached_tokens=seq.num_cached_prompt_tokens, stop_reason=stop_reason)

    def _advance_logits_states(self, seq: Sequence, token: int) -> str | None:
        """"complete" when a processor says nothing but EOS may follow, "error" when one rejects the token."""
        if not seq.logits_states:
            return None
        try:
            return "complete" if self.logits.accept(seq.logits_states, token) else None
        except Exception:
            log.exception("logits processing rejected token %d of request %s", token, seq.request_id)
            return "error"

