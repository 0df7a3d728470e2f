"""JSON Schema -> an llguidance grammar, and the checks that name what is wrong.

JSON comes out on one line with json.dumps' separators (``{"a": 1, "b": [2, 3]}``): with free
whitespace a small model can spend its whole budget on newlines and never close the document.
For the same reason an object that lists its properties takes no others unless its schema says
so (``additionalProperties``), as xgrammar's strict mode does by default: the output still
validates against the schema, and a model cannot wander off into keys of its own.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from ..errors import InvalidRequest

JSON_FORMAT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def parse_schema(text: str, what: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise InvalidRequest(f"{what}: the schema is not valid JSON ({exc})", param=_param(what)) from None


def json_grammar(llguidance: Any, schema: Any, validate: Callable[[str], str | None], what: str) -> str:
    if not isinstance(schema, dict):
        raise InvalidRequest(f"{what}: a schema must be a JSON object", param=_param(what))
    try:
        grammar = llguidance.LLMatcher.grammar_from_json_schema(json.dumps(schema), overrides=JSON_FORMAT)
    except ValueError as exc:
        raise InvalidRequest(f"{what}: {exc}", param=_param(what)) from None
    check(validate(grammar), what)
    return grammar


def closed_objects(schema: Any) -> Any:
    """A copy where every object schema that lists ``properties`` and says nothing about other
    keys (additionalProperties, patternProperties, unevaluatedProperties) allows no other keys."""
    if isinstance(schema, list):
        return [closed_objects(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: closed_objects(v) if k not in ("const", "enum", "default", "examples") else v
           for k, v in schema.items()}
    if isinstance(schema.get("properties"), dict) and not {"additionalProperties", "patternProperties",
                                                           "unevaluatedProperties"} & schema.keys():
        out["additionalProperties"] = False
    return out


def check(error: str | None, what: str) -> None:
    if error:
        raise InvalidRequest(f"{what}: {error.strip()}", param=_param(what))


def _param(what: str) -> str:
    """The request field a message is about: its first word when that names a field a constraint
    comes from (response_format, structured_outputs, grammar; Messages' output_config, Responses'
    text), else tools (a tool's schema)."""
    first = what.split(" ", 1)[0]
    return first if first in ("response_format", "structured_outputs", "grammar", "output_config", "text") else "tools"
