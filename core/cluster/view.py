"""The ingress's figures of the cluster: per replica what it was sent and what it reported, and
the cluster totals (prefix hit rate = cached prompt tokens / prompt tokens over the requests
that started generating).

Everything comes from the streams the ingress reads: every output carries its replica's id and
latest engine snapshot, so a busy replica's figures are as fresh as its last token; an idle one
changes only when the ingress sends it work. A replica whose stream broke because it died is
marked dead: its gauges leave the totals, its counters stay in them (Prometheus counters never
go down). A replacement appears when it first serves.
"""
from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields
from typing import Any, Iterable

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from ..engine.stats import EngineSnapshot
from .messages import ReplicaReport

GAUGES = ("requests_active", "queue_depth", "kv_blocks_total", "kv_blocks_used", "kv_blocks_cached", "tokens_per_sec")


@dataclass
class ReplicaFigures:
    replica: str
    pid: int
    snapshot: EngineSnapshot
    reported_at: float
    alive: bool = True
    requests_total: int = 0  # requests that started generating here
    requests_in_flight: int = 0
    requests_failed: int = 0
    prompt_tokens: int = 0
    cached_prompt_tokens: int = 0

    def as_json(self, now: float) -> dict[str, Any]:
        figures = {k: v for k, v in asdict(self).items() if k not in ("snapshot", "reported_at")}
        return {**figures, "prefix_hit_rate": hit_rate(self.cached_prompt_tokens, self.prompt_tokens),
                "report_age_s": round(now - self.reported_at, 3), **asdict(self.snapshot)}


def hit_rate(cached: int, prompt: int) -> float:
    return round(cached / prompt, 4) if prompt else 0.0


class ClusterView:
    def __init__(self) -> None:
        self.replicas: dict[str, ReplicaFigures] = {}
        self.requests_retried = 0  # re-sent after their replica died before the first token
        self.requests_failed = 0  # ended by a replica failure

    # --- what the client tells it -------------------------------------------------------
    def started(self, report: ReplicaReport, prompt_tokens: int, cached_tokens: int) -> None:
        """A request's first output arrived from report.replica."""
        figures = self.reported(report)
        figures.requests_total += 1
        figures.requests_in_flight += 1
        figures.prompt_tokens += prompt_tokens
        figures.cached_prompt_tokens += cached_tokens

    def reported(self, report: ReplicaReport) -> ReplicaFigures:
        figures = self.replicas.get(report.replica)
        if figures is None:
            figures = self.replicas[report.replica] = ReplicaFigures(report.replica, report.pid, report.snapshot,
                                                                      time.monotonic())
        figures.snapshot = report.snapshot
        figures.reported_at = time.monotonic()
        figures.alive = True
        return figures

    def ended(self, replica: str, failed: bool) -> None:
        """A request that had started on ``replica`` finished or stopped (failed: by an error)."""
        figures = self.replicas[replica]
        figures.requests_in_flight -= 1
        if failed:
            figures.requests_failed += 1

    def died(self, replica: str) -> None:
        figures = self.replicas.get(replica)
        if figures is not None:
            figures.alive = False

    # --- what it shows ------------------------------------------------------------------
    def snapshot(self) -> EngineSnapshot:
        """The engine figures of the whole cluster, in the single engine's shape (/metrics)."""
        totals: dict[str, Any] = {}
        for f in fields(EngineSnapshot):
            totals[f.name] = sum(getattr(r.snapshot, f.name) for r in self.replicas.values()
                                 if r.alive or f.name not in GAUGES)
        return EngineSnapshot(**totals)

    def as_json(self) -> dict[str, Any]:
        now = time.monotonic()
        replicas = list(self.replicas.values())
        prompt = sum(r.prompt_tokens for r in replicas)
        cached = sum(r.cached_prompt_tokens for r in replicas)
        alive = [r for r in replicas if r.alive]
        return {
            "cluster": {
                "replicas_alive": len(alive),
                "requests_total": sum(r.requests_total for r in replicas),
                "requests_in_flight": sum(r.requests_in_flight for r in alive),
                "requests_retried": self.requests_retried,
                "requests_failed": self.requests_failed,
                "queue_depth": sum(r.snapshot.queue_depth for r in alive),
                "prompt_tokens_total": prompt,
                "cached_prompt_tokens_total": cached,
                "prefix_hit_rate": hit_rate(cached, prompt),
            },
            "replicas": [r.as_json(now) for r in sorted(replicas, key=lambda r: r.replica)],
        }


class ClusterCollector:
    """The cluster view as Prometheus series (registered beside the server's own)."""

    def __init__(self, view: ClusterView) -> None:
        self.view = view

    def collect(self) -> Iterable[Metric]:
        data = self.view.as_json()
        cluster = data["cluster"]
        yield GaugeMetricFamily("qwen_serve_cluster_prefix_hit_rate", "cached prompt tokens / prompt tokens",
                                value=cluster["prefix_hit_rate"])
        yield GaugeMetricFamily("qwen_serve_cluster_replicas_alive", "engine replicas alive",
                                value=cluster["replicas_alive"])
        for name in ("requests_retried", "requests_failed"):
            yield CounterMetricFamily(f"qwen_serve_cluster_{name}", name, value=cluster[name])
        per_replica = {
            "requests": (CounterMetricFamily, "requests that started generating on the replica"),
            "prompt_tokens": (CounterMetricFamily, "prompt tokens of those requests"),
            "cached_prompt_tokens": (CounterMetricFamily, "of which served by the prefix cache"),
            "requests_in_flight": (GaugeMetricFamily, "requests streaming from the replica"),
            "queue_depth": (GaugeMetricFamily, "requests waiting in the replica's engine"),
            "kv_blocks_used": (GaugeMetricFamily, "KV blocks in use on the replica"),
        }
        for name, (kind, doc) in per_replica.items():
            family = kind(f"qwen_serve_replica_{name}", doc, labels=["replica"])
            for r in data["replicas"]:
                if r["alive"] or kind is CounterMetricFamily:
                    family.add_metric([r["replica"]], r["requests_total" if name == "requests" else name])
            yield family
