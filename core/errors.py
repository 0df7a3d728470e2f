"""Errors that reach users as one line (CLI exit code 2, HTTP 400), never as a traceback."""


class QwenServeError(Exception):
    """Base class: the message is complete and fit to show a user as is."""


class PluginNotFound(QwenServeError):
    pass


class PluginUnavailable(QwenServeError):
    pass


class ModelLoadError(QwenServeError):
    pass


class InvalidRequest(QwenServeError, ValueError):
    """Bad input from a client: HTTP 400, never a 500."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param
