"""Turning a step's logits into tokens when some chunks carry drafts.

Chunks without drafts are sampled exactly as in a step without speculation (consecutive ones
in one sampler call); a chunk with k drafts has k + 1 rows of logits, row i scoring the token
after its i-th draft. Greedy: a draft is kept iff it equals the row's argmax (the sampler's
own argmax, first maximum on ties), and the argmax after the kept prefix is the extra token,
so the output equals decoding without speculation token for token. Sampled: the sampler's
rejection rule (DraftVerifying), so the output is distributed as without speculation.
"""
from __future__ import annotations

import logging
from typing import Any

from ..protocols import Sampler, ScheduledChunk
from .sequence import Sequence
from .step_sampler import StepSampler

log = logging.getLogger("qwen_serve.engine")

Drawn = tuple[list[Any], list[Any]]  # a chunk's emitted tokens (None: its sampling failed) and their logprobs


def draw(step_sampler: StepSampler, sampler: Sampler, logits: Any,
         sampled: list[tuple[Sequence, ScheduledChunk]]) -> list[Drawn]:
    """What each sampled chunk emits, in chunk order."""
    out: list[Drawn] = []
    pending: list[Sequence] = []  # consecutive chunks without drafts, sampled together
    first_pending = row = 0

    def flush() -> None:
        if pending:
            tokens, logprobs = step_sampler.sample(logits[first_pending:first_pending + len(pending)], pending)
            out.extend(([t], [lp]) for t, lp in zip(tokens, logprobs))
            pending.clear()

    for seq, chunk in sampled:
        if not chunk.num_draft:
            if not pending:
                first_pending = row
            pending.append(seq)
            row += 1
            continue
        flush()
        draft = list(chunk.token_ids[-chunk.num_draft:])
        tokens = verify(sampler, logits[row:row + chunk.num_draft + 1], seq, draft)
        out.append((tokens, [None] * len(tokens)))
        row += chunk.num_draft + 1
    flush()
    return out


def verify(sampler: Sampler, rows: Any, seq: Sequence, draft: list[int]) -> list[int | None]:
    """The accepted prefix of draft plus one token from the target; [None] if sampling failed."""
    try:
        if not seq.params.greedy:
            return sampler.verify_draft(rows, seq.params, seq.generator, draft)
        n = len(draft) + 1
        best = sampler.sample(rows, [seq.params] * n, [seq.generator] * n).token_ids  # greedy draws nothing
        kept = 0
        while kept < len(draft) and best[kept] == draft[kept]:
            kept += 1
        return draft[:kept] + [best[kept]]
    except Exception:
        log.exception("verifying %d drafts failed for request %s", len(draft), seq.request_id)
        return [None]
