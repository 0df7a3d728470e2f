"""Typed readers for the fields of a JSON request body.

Strict about types (a bool is not a number, a float is not an integer) and silent about fields
nobody asked for, as OpenAI clients send extras. Every rejection is an InvalidRequest whose
``param`` is the field's path, e.g. ``response_format.json_schema.name``.
"""
from __future__ import annotations

import json
import math
from typing import Any

from ..errors import InvalidRequest

MAX_JSON_DEPTH = 64  # arrays and objects inside each other; tool schemas nest a dozen at most


def parse_json_object(raw: bytes) -> dict[str, Any]:
    try:
        body = load_json(raw, "request body")
    except json.JSONDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON ({exc.msg})") from None
    except UnicodeDecodeError as exc:
        raise InvalidRequest(f"request body is not valid JSON ({exc})") from None
    if not isinstance(body, dict):
        raise InvalidRequest("request body must be a JSON object")
    return body


def load_json(text: str | bytes, what: str, param: str | None = None) -> Any:
    """json.loads of client input, whose nesting past MAX_JSON_DEPTH (the decoder's own recursion
    limit included) is an InvalidRequest naming the limit; decoding errors go to the caller."""
    too_deep = InvalidRequest(f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels", param=param)
    try:
        value = json.loads(text)
    except RecursionError:
        raise too_deep from None
    if json_depth(value) > MAX_JSON_DEPTH:
        raise too_deep
    return value


def json_depth(value: Any) -> int:
    """How many arrays and objects nest at the deepest point (without recursion)."""
    deepest = 0
    pending = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if depth <= MAX_JSON_DEPTH:  # past the limit the answer is known
            pending.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest


def path(where: str, name: str) -> str:
    return f"{where}.{name}" if where else name


def number(body: dict, name: str, default: float, low: float, high: float, *, low_open: bool = False,
           where: str = "") -> float:
    """A finite number in [low, high] (or (low, high] with low_open); high may be math.inf."""
    field = path(where, name)
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise InvalidRequest(f"'{field}' must be a finite number", param=field)
    if value < low or value > high or (low_open and value == low):
        if math.isinf(high):
            limit = f"{'>' if low_open else '>='} {low}"
        else:
            limit = f"in {'(' if low_open else '['}{low}, {high}]"
        raise InvalidRequest(f"'{field}' must be {limit}, got {value}", param=field)
    return float(value)


def integer(body: dict, name: str, default: int | None, low: int, high: int | None = None,
            where: str = "") -> int | None:
    field = path(where, name)
    value = body.get(name)
    if value is None:
        return default
    value = _integral(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"'{field}' must be an integer", param=field)
    if value < low or (high is not None and value > high):
        limit = f">= {low}" if high is None else f"in [{low}, {high}]"
        raise InvalidRequest(f"'{field}' must be {limit}, got {value}", param=field)
    return value


def boolean(body: dict, name: str, default: bool, where: str = "") -> bool:
    field = path(where, name)
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise InvalidRequest(f"'{field}' must be a boolean", param=field)
    return value


def string(body: dict, name: str, where: str = "", *, required: bool = False) -> str | None:
    return _typed(body, name, where, required, str, "a string")


def mapping(body: dict, name: str, where: str = "", *, required: bool = False) -> dict[str, Any] | None:
    return _typed(body, name, where, required, dict, "an object")


def _typed(body: dict, name: str, where: str, required: bool, kind: type, noun: str) -> Any:
    field = path(where, name)
    value = body.get(name)
    if value is None:
        if required:
            raise InvalidRequest(f"'{field}' is required", param=field)
        return None
    if not isinstance(value, kind):
        raise InvalidRequest(f"'{field}' must be {noun}", param=field)
    return value


def _integral(value: Any) -> Any:
    """8.0 as 8: an integer to JSON Schema (and pydantic); anything else as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def token_id(value: Any, field: str, vocab_size: int) -> int:
    value = _integral(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < vocab_size:
        raise InvalidRequest(f"'{field}' must hold token ids in [0, {vocab_size}), got {value!r}", param=field)
    return value


def token_ids(value: Any, field: str, vocab_size: int, *, allow_empty: bool = False) -> list[int]:
    if not isinstance(value, list) or (not value and not allow_empty):
        kind = "an array" if allow_empty else "a non-empty array"
        raise InvalidRequest(f"'{field}' must be {kind} of token ids", param=field)
    return [token_id(t, field, vocab_size) for t in value]
