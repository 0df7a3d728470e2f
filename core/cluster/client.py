"""The ingress's engine: an EngineClient (qwen_serve.engine.client) whose requests run on the
engine replicas, reached through a streaming Ray Serve deployment handle. The OpenAI layer
above it is the single-process server's, unchanged.

``generate`` validates at once with the engine's own checks (qwen_serve.cluster.checks), so bad
input is a 400 before any byte is sent, then computes the prompt's chained block hashes with the
engine's own function: the request router ranks replicas by them. A replica that dies before the first
output is retried on another one (nothing was sent yet); after it, the request fails with an
EngineFailure saying so. Closing the generator cancels the remote stream, which aborts the
request on its replica.
"""
from __future__ import annotations

import time
from contextlib import AbstractContextManager
from dataclasses import replace
from typing import Any, AsyncGenerator, Sequence

from ray.exceptions import RayActorError, RayError, RayTaskError
from ray.serve.exceptions import RayServeException, ReplicaUnavailableError

from ..engine.client import ViewUnavailable
from ..engine.engine import Engine
from ..engine.failures import EngineFailure
from ..engine.outputs import RequestOutput
from ..engine.stats import EngineSnapshot
from ..engine.view import EngineView
from ..errors import InvalidRequest
from ..kv.block_hash import chain_hashes
from ..sampling.params import SamplingParams
from .messages import EngineRequest
from .replica_views import ReplicaViews
from .view import ClusterView


class RayEngineClient:
    def __init__(self, engines: Any, checks: Engine, view: ClusterView, retries: int = 2,
                 replica_views: ReplicaViews | None = None) -> None:
        """``engines``: the DeploymentHandle of the engine replicas; ``checks``: the ingress's
        weightless engine (qwen_serve.cluster.checks), which only validates; ``replica_views``:
        the engine views of the replicas (None under a router that cannot send a view request
        to a chosen replica)."""
        self.engine = checks
        self.view = view
        self.replica_views = replica_views
        self.retries = retries
        self._generate = engines.options(method_name="generate", stream=True)

    @property
    def snapshot(self) -> EngineSnapshot:
        return self.view.snapshot()

    def watch(self) -> AbstractContextManager[None]:
        if self.replica_views is None:
            raise ViewUnavailable("the engine view needs a router that can reach a chosen replica "
                                  "(--router affinity or round-robin)")
        return self.replica_views.watch()

    def views(self) -> dict[str, EngineView]:
        return dict(self.replica_views.latest) if self.replica_views is not None else {}

    def is_alive(self) -> bool:
        return True  # a replica that dies fails its own requests (and is retried before the first token)

    def generate(self, request_id: str, prompt: Sequence[int], params: SamplingParams,
                 arrival_time: float, priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        checked = self.engine.check_request(prompt, params)
        self.engine.check_priority(priority)
        block_size = self.engine.config.block_size
        hashes = tuple(chain_hashes(checked, block_size, len(checked) // block_size))
        return self._stream(EngineRequest(request_id, tuple(checked), params, 0.0, hashes, priority), arrival_time)

    def pool(self, request_id: str, prompt: Sequence[int], arrival_time: float) -> AsyncGenerator[RequestOutput, None]:
        """Embedding and reranking replicas are not deployed through Ray (the ingress's engine
        generates, so its check refuses first)."""
        self.engine.check_pooling(prompt)
        raise InvalidRequest("the Ray ingress serves text generation only")

    async def _stream(self, request: EngineRequest, arrival_time: float) -> AsyncGenerator[RequestOutput, None]:
        for attempt in range(self.retries + 1):
            responses = self._generate.remote(replace(request, waited_s=time.monotonic() - arrival_time))
            replica: str | None = None
            finished = failed = False
            try:
                async for item in responses:
                    if replica is None:
                        replica = item.report.replica
                        self.view.started(item.report, len(request.prompt), item.output.num_cached_tokens)
                    else:
                        self.view.reported(item.report)
                    finished = item.output.finished
                    yield item.output
                return
            except (RayActorError, ReplicaUnavailableError) as exc:  # its process died or cannot be reached
                failed = True
                if replica is not None:
                    self.view.died(replica)
                elif attempt < self.retries:
                    self.view.requests_retried += 1
                    continue
                self.view.requests_failed += 1
                where = f"replica {replica} serving" if replica else "replica chosen for"
                raise EngineFailure(f"the engine {where} this request stopped ({type(exc).__name__}); "
                                    "Ray Serve replaces it, retry the request") from exc
            except (RayError, RayServeException) as exc:  # raised on the replica, or Serve could not route
                failed = True
                self.view.requests_failed += 1
                raise EngineFailure(f"the engine replica failed: {remote_message(exc)}") from exc
            finally:
                if replica is not None:
                    self.view.ended(replica, failed)
                if not finished:
                    responses.cancel()


def remote_message(exc: Exception) -> str:
    """The message of the exception raised on the replica, without Ray's traceback."""
    cause = exc.cause if isinstance(exc, RayTaskError) else None
    return f"{type(cause).__name__}: {cause}" if cause is not None else f"{type(exc).__name__}: {exc}"
