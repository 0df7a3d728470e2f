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
    pass
