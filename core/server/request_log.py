"""--log-requests: one JSON line per finished request on the `qwen_serve.requests` logger
(id, tokens, cached tokens, queue time, TTFT, total time, finish reason). The prompt text is
written only with --log-prompts."""
from __future__ import annotations

import json
import logging
import sys
import time
from typing import Callable, Sequence

from ..engine.stats import RequestRecord

LOGGER = "qwen_serve.requests"


def request_logger() -> logging.Logger:
    """The request logger, writing bare lines to stderr (its own handler: one line, no prefix)."""
    logger = logging.getLogger(LOGGER)
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    return logger


def _seconds(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class RequestLog:
    """A RequestObserver that logs each finished request."""

    def __init__(self, logger: logging.Logger, decode_prompt: Callable[[Sequence[int]], str] | None = None) -> None:
        self.logger = logger
        self.decode_prompt = decode_prompt

    def on_first_token(self, record: RequestRecord) -> None:
        pass

    def on_tokens(self, num_tokens: int, interval_s: float | None) -> None:
        pass

    def on_finished(self, record: RequestRecord) -> None:
        entry = {
            "event": "request", "time": round(time.time(), 3), "id": record.request_id,
            "finish_reason": record.finish_reason, "priority": record.priority,
            "prompt_tokens": record.prompt_tokens, "cached_tokens": record.cached_tokens,
            "completion_tokens": record.completion_tokens, "preemptions": record.num_preemptions,
            "queue_s": _seconds(record.queue_s), "ttft_s": _seconds(record.ttft_s), "total_s": _seconds(record.e2e_s),
        }
        if self.decode_prompt is not None:
            entry["prompt"] = self.decode_prompt(record.prompt_token_ids)
        self.logger.info(json.dumps(entry, ensure_ascii=False))
