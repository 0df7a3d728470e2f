"""The ingress deployment: the single-process server's own aiohttp application (ChatServer, the
OpenAI layer of qwen_serve.openai, unchanged) served from a Ray Serve replica, over an engine
client that forwards to the engine replicas. One HTTP layer, not two: validation, SSE, error
bodies and whatever the server grows are the same code as in ``python -m qwen_serve``.

It listens on its own host and port (Ray Serve's HTTP proxy is not used: it speaks ASGI, the
OpenAI layer is aiohttp). The replica tokenizes and renders with the checkpoint's tokenizer and
template, which it loads without weights. Besides the server's routes it serves the cluster
view at ``/metrics/cluster`` (JSON) and adds it to the Prometheus exposition; its page's engine
tab shows each replica's engine view (qwen_serve.cluster.replica_views).
"""
from __future__ import annotations

import logging
from typing import Any

from aiohttp import web
from prometheus_client import CollectorRegistry

from ..chat.format import ChatFormat
from ..checkpoints.checkpoint import load_checkpoint
from ..checkpoints.default_model import default_model_path
from ..openai.bodies import json_response
from ..registry import load_registry
from ..server.app import ChatServer, ServerInfo
from ..server.prometheus import RequestMetrics
from .checks import validation_engine
from .client import RayEngineClient
from .replica_views import ReplicaViews
from .spec import ClusterSpec
from .view import ClusterCollector, ClusterView

log = logging.getLogger("qwen_serve.cluster")
VIEWING_ROUTERS = ("affinity", "round-robin")  # the routers that send a ViewRequest to the replica it names


class Ingress:
    async def __init__(self, engines: Any, spec: ClusterSpec) -> None:
        """``engines``: the DeploymentHandle of the engine replicas (bound by the application)."""
        model = spec.model
        checkpoint = load_checkpoint(model.model if model.model is not None else default_model_path())
        config = model.engine_config
        self.view = ClusterView()
        replica_views = ReplicaViews(engines, self.view) if spec.router in VIEWING_ROUTERS else None
        client = RayEngineClient(engines, validation_engine(model, checkpoint, load_registry()), self.view,
                                 replica_views=replica_views)
        name = model.served_model_name or checkpoint.config.name
        aliases = tuple(a for a in (model.model, checkpoint.config.name) if a and a != name)
        info = ServerInfo(model=name, aliases=aliases, backend=model.backend, quant=model.quant,
                          block_size=config.block_size, kv_blocks_total=config.kv_blocks, max_batch=config.max_batch,
                          max_seq_len=client.engine.max_seq_len)
        chat_format = ChatFormat(checkpoint.tokenizer, model.reasoning_parser, model.tool_call_parser)
        registry = CollectorRegistry(auto_describe=False)
        server = ChatServer(spec.server, registry)
        # The request histograms of the single-process server are fed by its engine thread;
        # here they stay empty (each replica's figures are in the cluster view).
        server.attach(client, checkpoint.tokenizer, info, RequestMetrics(registry, name), chat_format,
                      checkpoint.config.sampling_defaults.served(model.generation_config))
        app = server.make_app()
        app.router.add_get("/metrics/cluster", self.cluster_metrics)
        server.metrics.registry.register(ClusterCollector(self.view))
        self.runner = server.runner(app)
        await self.runner.setup()
        await server.site(self.runner, spec.host, spec.port).start()
        log.info("ingress listening on %s:%d", spec.host, spec.port)

    async def cluster_metrics(self, request: web.Request) -> web.Response:
        return json_response(self.view.as_json())

    async def __del__(self) -> None:
        await self.runner.cleanup()
