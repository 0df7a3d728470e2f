"""Serving metrics: one set of figures, two expositions (flat JSON and Prometheus text).

The engine thread publishes an immutable EngineSnapshot (qwen_serve.engine.stats) after every
step; the event loop records request latencies. Prometheus text is produced by prometheus-client
from a collector that reads the same figures the JSON shows (`qwen_serve_*` names), next to the
vLLM-named histograms, counters and gauges of qwen_serve.server.prometheus (`qwen_serve:*`) in
the same registry.
"""
from __future__ import annotations

import time
from collections import deque
from dataclasses import asdict
from typing import Any, Iterable

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..percentiles import percentiles as shared_percentiles

WINDOW = 2048  # latency samples kept for percentiles


def percentiles(samples: Iterable[float]) -> dict[str, float]:
    """p50 and p95 in ms by the rule `qwen-serve bench` and the benchmark scripts use (so a figure
    here and there compare); 0.0 before the first sample."""
    return {name: 0.0 if value is None else round(value, 3)
            for name, value in shared_percentiles(samples, (50, 95)).items()}


class ServerMetrics:
    def __init__(self, snapshot_source: Any, registry: CollectorRegistry | None = None) -> None:
        self._source = snapshot_source  # has .snapshot (an EngineSnapshot)
        self.started = time.monotonic()
        self.requests_total = 0
        self.ttft_ms: deque[float] = deque(maxlen=WINDOW)
        self.tpot_ms: deque[float] = deque(maxlen=WINDOW)
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=False)
        self.registry.register(_Collector(self))

    def record_request(self) -> None:
        self.requests_total += 1

    def record_latency(self, ttft_s: float | None, decode_s: float, tokens: int) -> None:
        if ttft_s is not None:
            self.ttft_ms.append(ttft_s * 1000)
        if tokens > 1:
            self.tpot_ms.append(decode_s * 1000 / (tokens - 1))

    def as_json(self) -> dict[str, Any]:
        snap = asdict(self._source.snapshot)
        return {
            "uptime_s": round(time.monotonic() - self.started, 3),
            "requests_total": self.requests_total,
            "requests_active": snap.pop("requests_active"),
            "queue_depth": snap.pop("queue_depth"),
            "ttft_ms": percentiles(self.ttft_ms),
            "tpot_ms": percentiles(self.tpot_ms),
            "tokens_per_sec": round(snap.pop("tokens_per_sec"), 3),
            **snap,
        }

    def prometheus_text(self) -> bytes:
        return generate_latest(self.registry)


COUNTERS = {"requests_total", "prefix_cache_hits", "prefill_tokens_total", "decode_tokens_total", "preemptions_total",
            "spec_draft_tokens_total", "spec_accepted_tokens_total"}


class _Collector:
    def __init__(self, metrics: ServerMetrics) -> None:
        self.metrics = metrics

    def collect(self) -> Iterable[Metric]:
        data = self.metrics.as_json()
        for name, value in data.items():
            full = f"qwen_serve_{name}"
            if isinstance(value, dict):
                family = GaugeMetricFamily(full, f"{name} percentiles", labels=["quantile"])
                for label, v in value.items():
                    family.add_metric([{"p50": "0.5", "p95": "0.95"}[label]], v)
                yield family
            elif name in COUNTERS:
                yield CounterMetricFamily(full.removesuffix("_total"), name, value=value)
            else:
                yield GaugeMetricFamily(full, name, value=value)
