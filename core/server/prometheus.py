"""Prometheus metrics under the names vLLM's dashboards read, with the `qwen_serve:` prefix
instead of `vllm:` and the same `model_name` label.

Request histograms and token counters are fed on the engine thread by RequestMetrics (a
RequestObserver, from each request's engine timestamps); the gauges and the preemption count
are read from the engine snapshot at scrape time by EngineGauges. prometheus-client's own
types render the exposition.
"""
from __future__ import annotations

from typing import Any, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..engine.stats import RequestRecord

PREFIX = "qwen_serve:"
# vLLM's bucket boundaries, so its dashboards' quantile panels read the same resolution
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
               40.0, 80.0)
REQUEST_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                   240.0, 480.0, 960.0, 1920.0, 7680.0)
COMPLETED = ("stop", "length", "abort")  # vLLM's request_success_total finished_reason values
LATENCY_SMOOTHING = 0.1  # weight of the newest request in the running mean latency


class RequestMetrics:
    """A RequestObserver: time to first token, inter-token latency, end-to-end and queue time,
    token and prefix-cache counters, finished and rejected requests."""

    def __init__(self, registry: CollectorRegistry, model_name: str) -> None:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(PREFIX + name, doc, ["model_name"], buckets=buckets, registry=registry).labels(model_name)

        def counter(name: str, doc: str) -> Any:
            return Counter(PREFIX + name, doc, ["model_name"], registry=registry).labels(model_name)

        self.ttft = histogram("time_to_first_token_seconds", "Time to first token (queueing included).", TTFT_BUCKETS)
        self.itl = histogram("inter_token_latency_seconds", "Time between a request's successive outputs.",
                             ITL_BUCKETS)
        self.e2e = histogram("e2e_request_latency_seconds", "Arrival to last token of finished requests.",
                             REQUEST_BUCKETS)
        self.queue = histogram("request_queue_time_seconds", "Time a request waited before it was first scheduled.",
                               REQUEST_BUCKETS)
        self.prompt_tokens = counter("prompt_tokens", "Prompt tokens of requests that reached their first token.")
        self.generation_tokens = counter("generation_tokens", "Generated tokens.")
        self.prefix_queries = counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.")
        self.prefix_hits = counter("prefix_cache_hits", "Prompt tokens served from the prefix cache.")
        self._success = Counter(PREFIX + "request_success", "Finished requests by finish reason.",
                                ["model_name", "finished_reason"], registry=registry)
        self._rejected = Counter(PREFIX + "num_requests_rejected",
                                 "Requests refused before running: queue_full (HTTP 429), queue_timeout (503).",
                                 ["model_name", "reason"], registry=registry)
        self.model_name = model_name
        self.rejections: dict[str, int] = {}  # by reason, as the counter has them (for the engine view)
        self.mean_e2e_s: float | None = None  # smoothed, for Retry-After

    def rejected(self, reason: str) -> None:
        self._rejected.labels(self.model_name, reason).inc()
        self.rejections[reason] = self.rejections.get(reason, 0) + 1

    # --- RequestObserver ----------------------------------------------------------------
    def on_first_token(self, record: RequestRecord) -> None:
        self.ttft.observe(record.ttft_s)
        if record.queue_s is not None:
            self.queue.observe(record.queue_s)
        self.prompt_tokens.inc(record.prompt_tokens)
        self.prefix_queries.inc(record.prompt_tokens)
        self.prefix_hits.inc(record.cached_tokens)

    def on_tokens(self, num_tokens: int, interval_s: float | None) -> None:
        self.generation_tokens.inc(num_tokens)
        if interval_s is not None:
            self.itl.observe(interval_s)

    def on_finished(self, record: RequestRecord) -> None:
        if record.finish_reason == "queue_timeout":
            self.rejected("queue_timeout")
        if record.finish_reason not in COMPLETED:
            return
        self._success.labels(self.model_name, record.finish_reason).inc()
        if record.finish_reason != "abort" and record.e2e_s is not None:
            self.e2e.observe(record.e2e_s)
            last = self.mean_e2e_s
            self.mean_e2e_s = record.e2e_s if last is None else last + LATENCY_SMOOTHING * (record.e2e_s - last)


class EngineGauges:
    """Scrape-time figures from the engine snapshot: requests running and waiting, KV-cache
    usage (the fraction of blocks held, prefix-cache-only blocks included), preemptions, and
    speculative proposals verified and kept (vLLM's spec_decode counters)."""

    def __init__(self, snapshot_source: Any, model_name: str) -> None:
        self._source = snapshot_source  # has .snapshot (an EngineSnapshot)
        self._model_name = model_name

    def collect(self) -> Iterable[Metric]:
        snap = self._source.snapshot
        label = [self._model_name]
        running = GaugeMetricFamily(PREFIX + "num_requests_running", "Requests in the running batch.",
                                    labels=["model_name"])
        running.add_metric(label, snap.requests_active - snap.queue_depth)
        waiting = GaugeMetricFamily(PREFIX + "num_requests_waiting", "Requests waiting to be scheduled.",
                                    labels=["model_name"])
        waiting.add_metric(label, snap.queue_depth)
        usage = GaugeMetricFamily(PREFIX + "kv_cache_usage_perc", "Fraction of KV blocks in use (1 = full).",
                                  labels=["model_name"])
        usage.add_metric(label, snap.kv_blocks_used / snap.kv_blocks_total if snap.kv_blocks_total else 0.0)
        preemptions = CounterMetricFamily(PREFIX + "num_preemptions", "Sequences preempted for lack of KV blocks "
                                          "or for a higher priority.", labels=["model_name"])
        preemptions.add_metric(label, snap.preemptions_total)
        drafts = CounterMetricFamily(PREFIX + "spec_decode_num_draft_tokens", "Speculative proposals verified.",
                                     labels=["model_name"])
        drafts.add_metric(label, snap.spec_draft_tokens_total)
        accepted = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens", "Speculative proposals kept.",
                                       labels=["model_name"])
        accepted.add_metric(label, snap.spec_accepted_tokens_total)
        return [running, waiting, usage, preemptions, drafts, accepted]


class ConnectionGauges:
    """Scrape-time figures from the connection guard (connections.py): connections open, those
    refused past the caps, and those closed for a request head that came too late (or never)."""

    def __init__(self, guard: Any) -> None:
        self._guard = guard

    def collect(self) -> Iterable[Metric]:
        g = self._guard
        open_now = GaugeMetricFamily(PREFIX + "connections_open", "Client connections open now.")
        open_now.add_metric([], g.open_total)
        refused = CounterMetricFamily(PREFIX + "connections_refused", "Connections closed on arrival: past "
                                      "--max-connections or --max-connections-per-client.")
        refused.add_metric([], g.refused_total)
        late = CounterMetricFamily(PREFIX + "connections_timed_out", "Connections closed because no complete "
                                   "request head came within --request-timeout (slow or idle clients).")
        late.add_metric([], g.timed_out_total)
        return [open_now, refused, late]
