"""Everything a deployment needs to build its part, from the command line, as one picklable value
(Ray sends it to every replica, possibly on another machine)."""
from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Any

from ..config import EngineConfig
from ..engine.async_engine import ARRIVAL_WINDOW_S
from ..server.app import ServerOptions

ROUTERS = ("affinity", "round-robin", "default")


@dataclass(frozen=True)
class ModelSpec:
    """How each engine replica builds its engine, and how the ingress renders and checks."""

    model: str | None
    backend: str = "torch"
    kv_cache: str = "paged"
    dtype: str = "float32"
    quant: str = "none"
    engine_options: dict[str, Any] = field(default_factory=dict)  # EngineConfig fields
    served_model_name: str | None = None
    reasoning_parser: str | None = None
    tool_call_parser: str | None = None
    arrival_window_s: float = ARRIVAL_WINDOW_S  # how long a replica gathers a burst of requests
    generation_config: str = "auto"  # auto: the checkpoint's sampling defaults for fields a request leaves out

    @property
    def engine_config(self) -> EngineConfig:
        return EngineConfig(**self.engine_options)


@dataclass(frozen=True)
class ClusterSpec:
    """The deployments: where the ingress listens, how many engine replicas of what size, and
    which request router spreads requests over them."""

    model: ModelSpec
    host: str = "127.0.0.1"
    port: int = 8000
    replicas: int = 2
    cpus_per_replica: float = 1.0
    threads_per_replica: int = 1
    router: str = "affinity"
    imbalance_threshold: int = 8  # requests in flight; past it the least-loaded replica wins
    app_name: str = "qwen-serve"
    server: ServerOptions = ServerOptions()  # the ingress's API keys, admission and keep-alives

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"--replicas must be at least 1, got {self.replicas}")
        if self.cpus_per_replica <= 0:
            raise ValueError(f"--cpus-per-replica must be positive, got {self.cpus_per_replica:g}")
        if self.threads_per_replica < 1:
            raise ValueError(f"--threads-per-replica must be at least 1, got {self.threads_per_replica}")
        if self.router not in ROUTERS:
            raise ValueError(f"unknown --router {self.router!r}; choose one of {', '.join(ROUTERS)}")
        if self.imbalance_threshold < 0:
            raise ValueError(f"--imbalance-threshold must be >= 0, got {self.imbalance_threshold}")


def cluster_spec(args: argparse.Namespace, engine_options: dict[str, Any],
                 server: ServerOptions = ServerOptions()) -> ClusterSpec:
    """The spec of a parsed ``qwen-serve ray`` command line (qwen_serve.cluster.cli)."""
    model = ModelSpec(args.model, args.backend, args.kv_cache, args.dtype, args.quant, engine_options,
                      args.served_model_name, args.reasoning_parser, args.tool_call_parser, args.arrival_window,
                      args.generation_config)
    threads = args.threads_per_replica or max(1, int(args.cpus_per_replica))
    threshold = args.imbalance_threshold if args.imbalance_threshold is not None else model.engine_config.max_batch
    return ClusterSpec(model, args.host, args.port, args.replicas, args.cpus_per_replica, threads, args.router,
                       threshold, args.app_name, server)
