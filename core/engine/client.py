"""What the HTTP layer needs of an engine, so one OpenAI layer serves both an engine in this
process (AsyncEngine) and engines elsewhere (qwen_serve.cluster's client for Ray Serve replicas).

The handlers read the model's limits, validate a request before anything is sent, then iterate
its outputs; /metrics reads the latest snapshot. Nothing else of the engine reaches them.
"""
from __future__ import annotations

from contextlib import AbstractContextManager
from typing import AsyncGenerator, Protocol, Sequence, runtime_checkable

from ..models.config import ModelConfig
from ..sampling.params import SamplingParams
from .outputs import RequestOutput
from .stats import EngineSnapshot
from .view import EngineView


class RequestChecks(Protocol):
    """The engine's view of what a request may be (Engine has these)."""

    model_config: ModelConfig
    max_seq_len: int
    task: str  # generate, embed or rerank

    def check_request(self, prompt_token_ids: Sequence[int], params: SamplingParams) -> list[int]:
        """The prompt as ints; raises InvalidRequest for a request the engine would refuse."""

    def check_priority(self, priority: int) -> None:
        """Raises InvalidRequest for a priority the scheduling policy does not take."""

    def check_pooling(self, prompt_token_ids: Sequence[int]) -> list[int]:
        """check_request for an input to embed or score (InvalidRequest on a generating engine)."""


class EngineClient(Protocol):
    """An engine as the HTTP layer uses it (AsyncEngine is one)."""

    engine: RequestChecks
    snapshot: EngineSnapshot

    def generate(self, request_id: str, prompt: Sequence[int], params: SamplingParams,
                 arrival_time: float, priority: int = 0) -> AsyncGenerator[RequestOutput, None]:
        """Validates now (InvalidRequest before anything is queued or sent), then yields the
        request's outputs; closing the generator early aborts the request."""

    def pool(self, request_id: str, prompt: Sequence[int], arrival_time: float) -> AsyncGenerator[RequestOutput, None]:
        """An input to embed or score: validated now, then its one output (``pooled``)."""

    def is_alive(self) -> bool:
        """False once the engine can serve nothing more (/health then says "dead")."""


class ViewUnavailable(Exception):
    """This engine client cannot show the engine view as it is set up (the message says why)."""


@runtime_checkable
class ShowsEngineView(Protocol):
    """An engine client that can show the live engine view (/engine): AsyncEngine, and the Ray
    ingress's client (one view per replica)."""

    def watch(self) -> AbstractContextManager[None]:
        """While open (on the event loop), ``views`` is kept fresh; with nobody watching, no
        engine takes any. Raises ViewUnavailable when the client cannot."""

    def views(self) -> dict[str, EngineView]:
        """The latest view of each engine: "" names the engine in this process, a Ray replica id
        each replica's."""
