"""What the ingress and the engine replicas send each other through Ray Serve handles (plain
picklable dataclasses: Ray pickles the arguments and every streamed item)."""
from __future__ import annotations

from dataclasses import dataclass

from ..engine.outputs import RequestOutput
from ..engine.stats import EngineSnapshot
from ..engine.view import EngineView
from ..sampling.params import SamplingParams


@dataclass(frozen=True)
class EngineRequest:
    """A validated request for one engine replica. ``block_hashes`` are the prompt's chained
    full-block hashes (what the router ranks replicas by). ``waited_s`` is how long it has
    been waiting since it arrived at the ingress: monotonic clocks differ between machines, so
    the replica dates the arrival on its own clock."""

    request_id: str
    prompt: tuple[int, ...]
    params: SamplingParams
    waited_s: float
    block_hashes: tuple[bytes, ...]
    priority: int = 0


@dataclass(frozen=True)
class ReplicaReport:
    """Who served an output, and that replica's engine figures at that moment."""

    replica: str  # Ray Serve's replica id
    pid: int
    snapshot: EngineSnapshot


@dataclass(frozen=True)
class ReplicaOutput:
    output: RequestOutput
    report: ReplicaReport


@dataclass(frozen=True)
class ViewRequest:
    """Watch one replica's engine view (the routers send it to that replica alone)."""

    replica: str


@dataclass(frozen=True)
class ReplicaView:
    replica: str
    view: EngineView
