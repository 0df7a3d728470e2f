"""The engine view of each replica, for the ingress's page at /engine.

While someone watches, one stream per live replica the cluster view knows (each one that has
served a request) carries that replica's engine view to the ingress: a ViewRequest that the
routers send to the replica it names, answered by EngineReplica.watch. The streams close when
the last watcher leaves, so nobody watching costs the replicas nothing. A replica that appears
later is followed within a second; one whose stream fails is followed again while it lives.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, Iterator

from ray.exceptions import RayError
from ray.serve.exceptions import RayServeException

from ..engine.view import EngineView
from .messages import ViewRequest
from .view import ClusterView

log = logging.getLogger("qwen_serve.cluster")
DISCOVERY_S = 1.0  # how often the watched cluster's replicas are looked over


class ReplicaViews:
    def __init__(self, engines: Any, cluster: ClusterView) -> None:
        self._watch = engines.options(method_name="watch", stream=True)
        self.cluster = cluster
        self.latest: dict[str, EngineView] = {}
        self._watchers = 0
        self._following: asyncio.Task | None = None

    @contextlib.contextmanager
    def watch(self) -> Iterator[None]:
        """On the event loop: follow every replica while at least one watcher is in here."""
        self._watchers += 1
        if self._following is None:
            self._following = asyncio.get_running_loop().create_task(self._follow_all())
        try:
            yield
        finally:
            self._watchers -= 1
            if not self._watchers:
                self._following.cancel()
                self._following = None
                self.latest.clear()

    async def _follow_all(self) -> None:
        streams: dict[str, asyncio.Task] = {}
        try:
            while True:
                for replica, figures in list(self.cluster.replicas.items()):
                    stream = streams.get(replica)
                    if figures.alive and (stream is None or stream.done()):
                        streams[replica] = asyncio.create_task(self._follow(replica))
                    elif not figures.alive:
                        self.latest.pop(replica, None)
                        if stream is not None:
                            stream.cancel()
                await asyncio.sleep(DISCOVERY_S)
        finally:
            for stream in streams.values():
                stream.cancel()

    async def _follow(self, replica: str) -> None:
        responses = self._watch.remote(ViewRequest(replica))
        try:
            async for item in responses:
                self.latest[replica] = item.view
        except (RayError, RayServeException) as exc:
            log.warning("the engine view of replica %s failed: %s", replica, exc)
        finally:
            responses.cancel()
