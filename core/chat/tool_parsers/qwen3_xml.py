"""Qwen3-Coder / Qwen3.5 tool calls, an XML form with one element per argument::

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    <parameter=days>
    3
    </parameter>
    </function>
    </tool_call>

The text of a value says nothing of its type, so the offered tools' schemas do: a parameter
declared integer, number, boolean, object, array or null is read as JSON (True, False and None
as Python spells them too; the text when it does not parse), a string is kept verbatim, less the one newline the format puts on each side.
A block holding one closed ``<function=NAME>`` is a call, whether or not NAME was offered (as
vLLM's parser: the client sees what the model asked for); any other block stays content, and
so does a block cut off before ``</function>`` (call_blocks.ToolCallBlocks does the streaming).
"""
from __future__ import annotations

import functools
import json
import re
from typing import Any, ClassVar, Mapping, Sequence

from ...sampling.params import ToolCallFormat
from ..tools import Tool
from .base import ToolCall
from .call_blocks import ToolCallBlocks

FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*)</function>\s*", re.S)
PARAMETER = re.compile(r"<parameter=([^>\n]+)>(.*?)(?:</parameter>|(?=<parameter=)|\Z)", re.S)
# the template writes a value that is neither a mapping nor a list with Jinja's `string` filter,
# so the history shows the model Python's spelling of true, false and null
PYTHON_LITERALS = {"True": "true", "False": "false", "None": "null"}
JSON_TYPES = ((bool, "boolean"), (int, "integer"), (float, "number"), (type(None), "null"), (dict, "object"),
              (list, "array"), (str, "string"))


class Qwen3XmlToolParser(ToolCallBlocks):
    name: ClassVar[str] = "qwen3_xml"
    call_format: ClassVar[ToolCallFormat] = "qwen3_xml"

    def __init__(self, tools: Sequence[Tool] = ()) -> None:
        properties = {t.name: t.parameters.get("properties") or {} for t in tools}
        super().__init__(functools.partial(parse_xml_call, properties=properties))


def parse_xml_call(body: str, properties: Mapping[str, Mapping[str, Any]]) -> ToolCall | None:
    """``properties``: each offered tool's ``parameters.properties``, by tool name."""
    function = FUNCTION.fullmatch(body)
    if function is None or "<function=" in function[2]:
        return None
    name = function[1].strip()
    schemas = properties.get(name, {})
    arguments = {}
    for parameter in PARAMETER.finditer(function[2]):
        key = parameter[1].strip()
        arguments[key] = typed_value(_unwrapped(parameter[2]), schemas.get(key))
    return ToolCall.new(name, json.dumps(arguments, ensure_ascii=False)) if name else None


def _unwrapped(text: str) -> str:
    """The value without the newline the format writes after ``<parameter=...>`` and before its end."""
    text = text[1:] if text.startswith("\n") else text
    return text[:-1] if text.endswith("\n") else text


def typed_value(text: str, schema: Any) -> Any:
    types = declared_types(schema)
    if types <= {"string"}:  # a string, or nothing declared: the text as written
        return text
    try:
        value = json.loads(PYTHON_LITERALS.get(text.strip(), text), parse_constant=_refuse_constant)
    except (ValueError, RecursionError):
        return text
    if "string" in types and not _has_type(value, types):  # e.g. ["string", "null"]: only "null" is None
        return text
    return value


def declared_types(schema: Any) -> set[str]:
    declared = schema.get("type") if isinstance(schema, Mapping) else None
    if isinstance(declared, str):
        return {declared}
    return {t for t in declared if isinstance(t, str)} if isinstance(declared, list) else set()


def _has_type(value: Any, types: set[str]) -> bool:
    kind = next(name for cls, name in JSON_TYPES if isinstance(value, cls))
    return kind in types or (kind == "integer" and "number" in types)


def _refuse_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")  # NaN and Infinity would make the arguments invalid JSON
