"""StructuredOutput -> an llguidance grammar (JSON text): JSON documents (json_grammar) or
forced tool calls in the form the model's tool parser reads (tool_call_grammars)."""
from __future__ import annotations

from typing import Any, Callable

from ..sampling.params import StructuredOutput
from .json_grammar import closed_objects, json_grammar, parse_schema
from .tool_call_grammars import tool_calls_grammar


def grammar_for(structured: StructuredOutput, llguidance: Any, validate: Callable[[str], str | None],
                token_id: Callable[[str], int | None]) -> str:
    """The grammar text; InvalidRequest naming the part the library cannot compile.

    ``validate(grammar)`` returns the library's error message or None; ``token_id(text)`` the id
    of a text that the tokenizer holds as one added token.
    """
    if structured.kind == "json_object":
        return json_grammar(llguidance, {"type": "object"}, validate, "response_format")
    if structured.kind == "json_schema":
        schema = parse_schema(structured.schema, "response_format json_schema")
        return json_grammar(llguidance, closed_objects(schema), validate, "response_format json_schema")
    return tool_calls_grammar(structured.tool_format, structured.tools, llguidance, validate, token_id)
