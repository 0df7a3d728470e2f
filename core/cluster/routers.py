"""Ray Serve request routers for the engine replicas (set through RequestRouterConfig).

A router lives in each process that holds a handle to the engine deployment (here: the ingress)
and runs on that handle's event loop. Ray asks ``choose_replicas`` for ranks of candidates and
sends the request to the least-loaded replica of the first rank that has room; a replica is not
pinned to the request until it accepts it (``on_request_routed``). Neither router mixes in
FIFOMixin: a replica found for one request must serve that request, not the oldest one waiting.

PrefixAffinityRouter ranks with qwen_serve.cluster.affinity (pure, unit-tested). Its load
figure is its own count of requests in flight per replica (routed, not yet completed), which is
exact for the traffic of its ingress and costs no RPC; the replicas' own reports
(``record_routing_stats``, polled by Ray's controller) give each replica's KV pool size, which
bounds what the router believes it holds.

Both routers send a ViewRequest (the engine view of one replica, for the page at /engine) to the
replica it names; Ray Serve's default router cannot, so under it the ingress shows no engine view.
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any, Sequence

from ray.serve.request_router import PendingRequest, ReplicaID, RequestRouter, RunningReplica

from .affinity import AffinityPolicy
from .messages import EngineRequest, ViewRequest


def block_hashes(pending_request: PendingRequest | None) -> Sequence[bytes]:
    """The prompt's block hashes, when the call is an engine request (else none)."""
    if pending_request is None:
        return ()
    request = next((a for a in pending_request.args if isinstance(a, EngineRequest)), None)
    return request.block_hashes if request is not None else ()


def watched_replica(pending_request: PendingRequest | None) -> str | None:
    """The replica a view request names (it must go there and nowhere else), else None."""
    if pending_request is None:
        return None
    request = next((a for a in pending_request.args if isinstance(a, ViewRequest)), None)
    return request.replica if request is not None else None


def the_watched(candidates: list[RunningReplica], replica: str) -> list[list[RunningReplica]]:
    return [[r for r in candidates if r.replica_id.unique_id == replica]]


class PrefixAffinityRouter(RequestRouter):
    def initialize_state(self, capacity_blocks: int = 512, imbalance_threshold: int = 8,
                         min_match_blocks: int = 1, **_: Any) -> None:
        self.policy: AffinityPolicy[ReplicaID] = AffinityPolicy(capacity_blocks, imbalance_threshold, min_match_blocks)
        self.in_flight: defaultdict[ReplicaID, set[str]] = defaultdict(set)  # replica -> internal request ids

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if (watched := watched_replica(pending_request)) is not None:
            return the_watched(candidate_replicas, watched)
        by_id = {r.replica_id: r for r in candidate_replicas}
        loads = {replica_id: len(self.in_flight[replica_id]) for replica_id in by_id}
        ranks = self.policy.rank(block_hashes(pending_request), loads)
        return [[by_id[replica_id] for replica_id in rank] for rank in ranks]

    def on_request_routed(self, pending_request: PendingRequest, replica_id: ReplicaID, result: Any) -> None:
        if watched_replica(pending_request) is not None:
            return  # a view stream is no load
        self.in_flight[replica_id].add(pending_request.metadata.internal_request_id)
        self.policy.routed(replica_id, block_hashes(pending_request))

    def on_request_completed(self, replica_id: ReplicaID, internal_request_id: str) -> None:
        self.in_flight[replica_id].discard(internal_request_id)

    def update_replicas(self, replicas: list[RunningReplica]) -> None:
        super().update_replicas(replicas)
        self.policy.sync_replicas(r.replica_id for r in replicas)
        for r in replicas:
            self.policy.set_capacity(r.replica_id, int(r.routing_stats.get("kv_blocks_total", 0)))
        for gone in [replica_id for replica_id in self.in_flight if replica_id not in self.curr_replicas]:
            del self.in_flight[gone]

    def on_replica_actor_died(self, replica_id: ReplicaID) -> None:
        super().on_replica_actor_died(replica_id)
        self.policy.forget(replica_id)
        self.in_flight.pop(replica_id, None)


class RoundRobinRouter(RequestRouter):
    """Each request to the next replica in a fixed order (the baseline the affinity router is
    measured against; Ray Serve ships none). A full replica falls back to the others."""

    def initialize_state(self, **_: Any) -> None:
        self.turn = itertools.count()

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        if (watched := watched_replica(pending_request)) is not None:
            return the_watched(candidate_replicas, watched)
        ordered = sorted(candidate_replicas, key=lambda r: r.replica_id.unique_id)
        if not ordered:
            return []
        first = next(self.turn) % len(ordered)
        rest = ordered[first + 1:] + ordered[:first]
        return [[ordered[first]], rest] if rest else [[ordered[first]]]
