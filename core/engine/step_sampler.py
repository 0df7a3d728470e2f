"""One step's draws: each sampled row's logits-processor adjustment, then the backend's sampler.

All rows go to the sampler at once; if that raises, row by row, so one bad request fails alone
(its token is None) and the others go on. A batch that no processor touches reaches the sampler
exactly as it would without processors.
"""
from __future__ import annotations

import logging
from typing import Any

from ..logits.pipeline import LogitsPipeline
from ..protocols import Sampler, SampleResult
from ..sampling.adjustment import BatchAdjustment, LogitsAdjustment
from .sequence import Sequence

log = logging.getLogger("qwen_serve.engine")


class StepSampler:
    def __init__(self, sampler: Sampler, logits: LogitsPipeline) -> None:
        self.sampler = sampler
        self.logits = logits

    def sample(self, logits: Any, seqs: list[Sequence]) -> tuple[list[int | None], list[dict[int, float] | None]]:
        rows: list[LogitsAdjustment | None] = []
        failed: set[int] = set()
        for i, seq in enumerate(seqs):
            try:
                rows.append(self.logits.adjustment(seq, seq.logits_states) if seq.logits_states else None)
            except Exception:
                log.exception("logits processing failed for request %s", seq.request_id)
                rows.append(None)
                failed.add(i)
        if not failed:
            try:
                result = self._draw(logits, seqs, rows)
                return list(result.token_ids), list(result.logprobs or [None] * len(seqs))
            except Exception:
                log.exception("sampling a batch of %d rows failed; retrying row by row", len(seqs))
        tokens: list[int | None] = []
        logprobs: list[dict[int, float] | None] = []
        for i, seq in enumerate(seqs):
            result = None
            if i not in failed:
                try:
                    result = self._draw(logits[i:i + 1], [seq], [rows[i]])
                except Exception:
                    log.exception("sampling failed for request %s", seq.request_id)
            tokens.append(None if result is None else result.token_ids[0])
            logprobs.append(result.logprobs[0] if result is not None and result.logprobs else None)
        return tokens, logprobs

    def _draw(self, logits: Any, seqs: list[Sequence], rows: list[LogitsAdjustment | None]) -> SampleResult:
        params, generators = [s.params for s in seqs], [s.generator for s in seqs]
        adjustment = BatchAdjustment.of_rows(rows)
        if adjustment is None:
            return self.sampler.sample(logits, params, generators)
        return self.sampler.sample(logits, params, generators, adjustment=adjustment)
