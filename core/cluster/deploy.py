"""The Ray Serve application: N engine replicas behind the chosen request router, and one
ingress (pinned to the node this command runs on, so it listens where the user asked)."""
from __future__ import annotations

from ray import serve
from ray.serve.config import RequestRouterConfig

from .engine_replica import EngineReplica
from .ingress import Ingress
from .spec import ClusterSpec

# --router name -> request router class (None: Ray Serve's default, power of two choices)
ROUTER_CLASSES = {
    "affinity": "qwen_serve.cluster.routers:PrefixAffinityRouter",
    "round-robin": "qwen_serve.cluster.routers:RoundRobinRouter",
    "default": None,
}
ROUTING_STATS_PERIOD_S = 1.0  # how often Ray's controller polls each replica's record_routing_stats
GRACEFUL_SHUTDOWN_S = 5.0


def router_config(spec: ClusterSpec) -> RequestRouterConfig:
    options = dict(request_routing_stats_period_s=ROUTING_STATS_PERIOD_S, request_routing_stats_timeout_s=5.0)
    router = ROUTER_CLASSES[spec.router]
    if router is None:
        return RequestRouterConfig(**options)
    kwargs = {}
    if spec.router == "affinity":
        kwargs = {"capacity_blocks": spec.model.engine_config.kv_blocks,
                  "imbalance_threshold": spec.imbalance_threshold}
    return RequestRouterConfig(request_router_class=router, request_router_kwargs=kwargs, **options)


def build_app(spec: ClusterSpec, ingress_node_resource: str | None) -> serve.Application:
    """``ingress_node_resource``: Ray's ``node:<ip>`` resource of the node the ingress must run on."""
    threads = str(spec.threads_per_replica)
    engines = serve.deployment(EngineReplica).options(
        num_replicas=spec.replicas,
        # Requests queue in the engines (continuous batching), not in the router.
        max_ongoing_requests=max(16, 4 * spec.model.engine_config.max_batch),
        ray_actor_options={"num_cpus": spec.cpus_per_replica,
                           "runtime_env": {"env_vars": {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                                                        "TOKENIZERS_PARALLELISM": "false"}}},
        request_router_config=router_config(spec),
        health_check_period_s=2.0,
        health_check_timeout_s=30.0,
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
    )
    resources = {ingress_node_resource: 0.001} if ingress_node_resource else {}
    ingress = serve.deployment(Ingress).options(
        num_replicas=1,
        max_ongoing_requests=1000,  # never called through Serve: it listens on its own port
        ray_actor_options={"num_cpus": 0, "resources": resources,
                           "runtime_env": {"env_vars": {"TOKENIZERS_PARALLELISM": "false"}}},
        graceful_shutdown_timeout_s=GRACEFUL_SHUTDOWN_S,
    )
    return ingress.bind(engines.bind(spec.model), spec)
