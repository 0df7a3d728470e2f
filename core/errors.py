"""Errors that reach users as one line (CLI exit code 2, HTTP 400), never as a traceback."""
from __future__ import annotations

from typing import Iterable


class QwenServeError(Exception):
    """Base class: the message is complete and fit to show a user as is."""


class PluginNotFound(QwenServeError):
    pass


class PluginUnavailable(QwenServeError):
    pass


class ModelLoadError(QwenServeError):
    pass


def require_choice(what: str, name: str, choices: Iterable[str], where: str = "") -> None:
    """A one-line ModelLoadError naming the valid choices when ``name`` is not among them."""
    choices = list(choices)
    if name not in choices:
        raise ModelLoadError(f"unknown {what} {name!r}{where}; choose one of {', '.join(choices)}")


class FatalEngineError(QwenServeError):
    """Raised by a backend or KV cache when the engine cannot go on (a device lost, KV state that
    can no longer be trusted): unlike any other step failure it stops the engine thread, the
    server reports "dead" on /health, and every open request ends with an error."""


class InvalidRequest(QwenServeError, ValueError):
    """Bad input from a client: HTTP 400, never a 500."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
