"""What one streamed request measured, and a level's summary: throughput medians over
repetitions, latency percentiles over every request of every repetition."""
from __future__ import annotations

import statistics
from dataclasses import asdict, dataclass, field
from typing import Any, Sequence

from ..percentiles import percentiles as shared_percentiles

PERCENTILES = (50, 95, 99)


@dataclass
class RequestRecord:
    """One request as the client saw it; times are seconds from when it was sent."""

    prompt_tokens_asked: int
    output_tokens_asked: int
    sent: float = 0.0  # absolute, in the run's clock
    chunk_times: list[float] = field(default_factory=list)  # each content-carrying event's arrival
    prompt_tokens: int | None = None  # from usage
    output_tokens: int | None = None  # from usage, else the number of content events
    finish_reason: str | None = None
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and bool(self.chunk_times)

    @property
    def ttft(self) -> float:
        return self.chunk_times[0]

    @property
    def e2e(self) -> float:
        return self.chunk_times[-1]

    def inter_chunk_gaps(self) -> list[float]:
        return [b - a for a, b in zip(self.chunk_times, self.chunk_times[1:])]

    def tpot(self) -> float | None:
        """Mean time per output token after the first (exact even when a chunk holds several tokens)."""
        if not self.output_tokens or self.output_tokens < 2:
            return None
        return (self.e2e - self.ttft) / (self.output_tokens - 1)


def percentiles(samples: Sequence[float], quantiles: Sequence[float] = PERCENTILES) -> dict[str, float | None]:
    """p50/p95/p99 by default (qwen_serve.percentiles' rule, shared with the server's /metrics)."""
    return shared_percentiles(samples, quantiles)


@dataclass
class Repetition:
    wall_s: float
    requests: int
    failed: int
    output_tokens: int
    prompt_tokens: int
    started_s: float = 0.0  # from the start of the run: shows the order of interleaved endpoints

    @property
    def output_tok_s(self) -> float:
        return self.output_tokens / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def requests_s(self) -> float:
        return (self.requests - self.failed) / self.wall_s if self.wall_s > 0 else 0.0

    @property
    def input_tok_s(self) -> float:
        return self.prompt_tokens / self.wall_s if self.wall_s > 0 else 0.0


def repetition(records: Sequence[RequestRecord], wall_s: float, started_s: float = 0.0) -> Repetition:
    good = [r for r in records if r.ok]
    return Repetition(wall_s=wall_s, requests=len(records), failed=len(records) - len(good),
                      output_tokens=sum(r.output_tokens or 0 for r in good),
                      prompt_tokens=sum(r.prompt_tokens or r.prompt_tokens_asked for r in good), started_s=started_s)


def summarize(point: dict[str, Any], reps: Sequence[Repetition], records: Sequence[RequestRecord]) -> dict[str, Any]:
    """One sweep point: `point` (prompt/output tokens, concurrency) plus its figures."""
    good = [r for r in records if r.ok]
    tpots = [t for t in (r.tpot() for r in good) if t is not None]
    out_seen = [r.output_tokens for r in good if r.output_tokens is not None]
    prompt_seen = [r.prompt_tokens for r in good if r.prompt_tokens is not None]
    errors = sorted({r.error for r in records if r.error})
    return {
        **point,
        "output_tok_s": statistics.median(r.output_tok_s for r in reps),
        "requests_s": statistics.median(r.requests_s for r in reps),
        "input_tok_s": statistics.median(r.input_tok_s for r in reps),
        "ttft_s": percentiles([r.ttft for r in good]),
        "itl_s": percentiles([g for r in good for g in r.inter_chunk_gaps()]),
        "tpot_s": percentiles(tpots),
        "decode_tok_s_per_stream": 1.0 / statistics.median(tpots) if tpots else None,
        "e2e_s": percentiles([r.e2e for r in good]),
        "requests": len(records),
        "failed": len(records) - len(good),
        "errors": errors[:5],
        "prompt_tokens_seen": [min(prompt_seen), max(prompt_seen)] if prompt_seen else None,
        "output_tokens_seen": [min(out_seen), max(out_seen)] if out_seen else None,
        "output_length_honoured": sum(1 for r in good if r.output_tokens == r.output_tokens_asked) / len(good) if good else 0.0,
        "tokens_per_chunk": (sum(out_seen) / sum(len(r.chunk_times) for r in good)) if out_seen else None,
        "repetitions": [{**asdict(r), "output_tok_s": r.output_tok_s, "requests_s": r.requests_s} for r in reps],
    }
