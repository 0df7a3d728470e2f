"""A request's arguments for plugins (SamplingParams.extra_args; ``vllm_xargs`` over HTTP, as in
vLLM): JSON values under names that some loaded plugin claims (protocols.TakesRequestArgs).

They are kept as sorted (name, JSON text) pairs, so SamplingParams stays frozen and hashable and
each plugin reads back plain JSON values it cannot alter for anyone else.
"""
from __future__ import annotations

import json
import math
from typing import Any, Iterable, Mapping

from ..errors import InvalidRequest

PARAM = "vllm_xargs"  # the HTTP field's name; errors about these arguments name it
StoredArgs = tuple[tuple[str, str], ...]


def freeze_request_args(args: Mapping[str, Any] | StoredArgs) -> StoredArgs:
    """Sorted (name, JSON text) pairs from a mapping of JSON values. A tuple is taken as pairs
    already in that form (what a constructed SamplingParams holds, so dataclasses.replace keeps it)."""
    if isinstance(args, tuple):
        if not all(_is_stored_pair(pair) for pair in args):
            raise InvalidRequest(f"{PARAM} as a tuple must be (name, JSON text) pairs; pass a mapping of "
                                 "names to values instead", param=PARAM)
        return tuple(sorted(args))
    if not isinstance(args, Mapping):
        raise InvalidRequest(f"{PARAM} must be a mapping of names to JSON values, got {type(args).__name__}",
                             param=PARAM)
    for name, value in args.items():
        if not isinstance(name, str) or not name:
            raise InvalidRequest(f"{PARAM} names must be non-empty strings, got {name!r}", param=PARAM)
        _check_json(value, name)
    return tuple(sorted((name, json.dumps(value, sort_keys=True)) for name, value in args.items()))


def thaw_request_args(stored: StoredArgs, names: Iterable[str]) -> dict[str, Any]:
    """The given names' values (those the request carries), as fresh JSON values."""
    wanted = set(names)
    return {name: json.loads(text) for name, text in stored if name in wanted}


def _is_stored_pair(pair: Any) -> bool:
    if not (isinstance(pair, tuple) and len(pair) == 2 and isinstance(pair[0], str) and isinstance(pair[1], str)):
        return False
    try:
        json.loads(pair[1])
    except ValueError:
        return False
    return True


def _check_json(value: Any, name: str) -> None:
    """JSON's own types only (no NaN or infinity, object keys strings), checked without recursion."""
    pending = [value]
    while pending:
        item = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidRequest(f"{PARAM}: {name!r} holds {item}, which JSON cannot carry", param=PARAM)
        if isinstance(item, dict):
            if not all(isinstance(key, str) for key in item):
                raise InvalidRequest(f"{PARAM}: {name!r} holds an object with a key that is not a string",
                                     param=PARAM)
            pending.extend(item.values())
        elif isinstance(item, list):
            pending.extend(item)
        elif item is not None and not isinstance(item, (bool, int, float, str)):
            raise InvalidRequest(f"{PARAM}: {name!r} holds a {type(item).__name__}, not a JSON value "
                                 "(null, boolean, number, string, array or object)", param=PARAM)
