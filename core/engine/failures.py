"""How a request can fail on the engine's side (not bad input: that is InvalidRequest), each with
the HTTP status that says so. AsyncEngine ends a request's output stream with one of these."""
from __future__ import annotations


class EngineFailure(Exception):
    """The engine could not finish this request (a server-side failure, not bad input)."""

    status = 500  # the HTTP status that says so


class EngineUnavailable(EngineFailure):
    """Not served now, through no fault of the request; a later try may succeed."""

    status = 503


class EngineDead(EngineUnavailable):
    pass


class QueueTimeout(EngineUnavailable):
    pass


class ShuttingDown(EngineUnavailable):
    pass
