"""StructuredOutput -> an llguidance grammar (JSON text): JSON documents (json_grammar), forced
tool calls in the form the model's tool parser reads (tool_call_grammars), a regular expression,
a choice of strings or a Lark grammar (llguidance compiles each; llama.cpp's GBNF is translated
to Lark first, lark_from_gbnf)."""
from __future__ import annotations

from typing import Any, Callable

from ..errors import InvalidRequest
from ..sampling.params import StructuredOutput
from .json_grammar import check, closed_objects, json_grammar, parse_schema
from .tool_call_grammars import tool_calls_grammar


def grammar_for(structured: StructuredOutput, llguidance: Any, validate: Callable[[str], str | None],
                token_id: Callable[[str], int | None]) -> str:
    """The grammar text; InvalidRequest naming the part the library cannot compile.

    ``validate(grammar)`` returns the library's error message or None; ``token_id(text)`` the id
    of a text that the tokenizer holds as one added token.
    """
    what = f"{structured.field} {structured.kind}"
    if structured.kind == "json_object":
        return json_grammar(llguidance, {"type": "object"}, validate, what)
    if structured.kind == "json_schema":
        return json_grammar(llguidance, closed_objects(parse_schema(structured.schema, what)), validate, what)
    if structured.kind in LIBRARY_FORMATS:
        try:
            grammar = llguidance.grammar_from(LIBRARY_FORMATS[structured.kind], structured.schema)
        except ValueError as exc:
            raise InvalidRequest(f"{what}: {exc}", param=structured.field) from None
        check(validate(grammar), what)
        return grammar
    return tool_calls_grammar(structured.tool_format, structured.tools, llguidance, validate, token_id,
                              structured.single_call)


LIBRARY_FORMATS = {"regex": "regex", "choice": "choice", "grammar": "lark"}  # kind -> llguidance.grammar_from's


def lark_from_gbnf(gbnf: str, field: str) -> str:
    """llama.cpp's GBNF as Lark; InvalidRequest naming what llguidance's translator refused."""
    from llguidance.gbnf_to_lark import gbnf_to_lark

    try:
        return gbnf_to_lark(gbnf)
    except Exception as exc:  # the translator raises bare Exceptions and parser errors alike
        raise InvalidRequest(f"{field}: the GBNF grammar cannot be translated to Lark ({exc})", param=field) from None
