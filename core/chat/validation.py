"""Request bodies as pydantic models: the one declaration their validation and the OpenAPI
document both come from (qwen_serve.openai.protocol declares the routes, the pieces they share
live beside this file).

Strict about types (a bool is not a number, "0.5" is not a number, 2.5 is not an integer; 8.0
is, as in JSON Schema), a null field is the field left out (as OpenAI's own schema allows), and
fields nobody asked for are ignored, as OpenAI clients send extras. Every rejection is an
InvalidRequest whose ``param`` is the field's path, e.g. ``response_format.json_schema.name``.
"""
from __future__ import annotations

import json
from typing import Annotated, Any, ClassVar, Literal, Sequence, Union

from pydantic import (
    BaseModel,
    BeforeValidator,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    TypeAdapter,
    ValidationError,
    model_validator,
)

from ..errors import InvalidRequest

MAX_JSON_DEPTH = 64  # arrays and objects inside each other; tool schemas nest a dozen at most


def _integral(value: Any) -> Any:
    """8.0 as 8: an integer to JSON Schema; anything else as it is (for the strict check)."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


Integer = Annotated[int, BeforeValidator(_integral)]


def integer(**bounds: int) -> Any:
    """Integer with bounds (ge, le): given before the 8.0-as-8 step, so the schema shows them."""
    return Annotated[int, Field(**bounds), BeforeValidator(_integral)]


class Body(BaseModel):
    """A JSON object of a request body."""

    model_config = ConfigDict(strict=True, allow_inf_nan=False, extra="ignore")

    @model_validator(mode="before")
    @classmethod
    def _null_means_omitted(cls, data: Any) -> Any:
        return {k: v for k, v in data.items() if v is not None} if isinstance(data, dict) else data


class Ignored(Body):
    """An object the request means the same without (a block, item or tool of a type this
    server does not use, or does not know)."""

    type: str


class _Refused(Body):
    refusal: ClassVar[str]

    def model_post_init(self, __context: Any) -> None:
        raise InvalidRequest(self.refusal, param="type")


def refused(kind: str, name: str, message: str) -> type[Body]:
    """A model of the objects of type ``kind`` that are a 400 with ``message`` (images, files:
    the served models read text only); ``name`` is its name in the OpenAPI document."""
    return type(name, (_Refused,), {"__annotations__": {"type": Literal[kind]}, "refusal": message,
                                    "__module__": __name__})


def text_or(items: Any, what: str = "content blocks") -> Any:
    """A string, or a list of ``items``: told apart by form, so a bad item's own error is the one reported."""
    return Annotated[Union[Annotated[str, Tag("text")], Annotated[list[items], Tag("items")]],
                     Discriminator(lambda v: "text" if isinstance(v, str) else "items" if isinstance(v, list) else None,
                                   custom_error_type="content_type",
                                   custom_error_message=f"must be a string or an array of {what}")]


def validate(schema: type[BaseModel] | TypeAdapter, data: Any, where: str = "", **context: Any) -> Any:
    """``data`` validated by a model or an adapter; the first failure is an InvalidRequest
    naming its field (``where`` is the path of ``data`` itself)."""
    try:
        if isinstance(schema, TypeAdapter):
            return schema.validate_python(data, context=context)
        return schema.model_validate(data, context=context)
    except ValidationError as exc:
        raise _invalid_request(exc.errors(), data, where) from None


def _invalid_request(errors: Sequence[dict[str, Any]], data: Any, where: str) -> InvalidRequest:
    """The first error's field, with every message about that field (a value that fits none of
    a union's forms gets one message per form)."""
    said = [_said(error, data, where) for error in errors]
    param = said[0][0]
    details = list(dict.fromkeys(detail for p, detail in said if p == param))
    return InvalidRequest(f"'{param}': {'; '.join(details)}" if param else "; ".join(details), param=param or None)


def _said(error: dict[str, Any], data: Any, where: str) -> tuple[str, str]:
    param = _join(where, _path(error["loc"], data, error["type"] == "missing"))
    cause = error.get("ctx", {}).get("error")
    if error["type"] in ("union_tag_invalid", "union_tag_not_found") and "discriminator" in error.get("ctx", {}):
        param = _join(param, error["ctx"]["discriminator"].strip("'"))
    if isinstance(cause, InvalidRequest) and cause.param:
        param = _join(param, cause.param)
    return param, str(cause) if isinstance(cause, Exception) else error["msg"]


def _path(loc: Sequence[str | int], data: Any, missing: bool) -> str:
    """pydantic's location as a path into the request: the steps that exist in ``data`` (a
    union's member names are no part of it), and the field at the end if it is missing."""
    path = ""
    for i, step in enumerate(loc):
        if isinstance(step, int) and isinstance(data, list) and 0 <= step < len(data):
            path, data = f"{path}[{step}]", data[step]
        elif isinstance(step, str) and isinstance(data, dict) and step in data:
            path, data = _join(path, step), data[step]
        elif missing and i == len(loc) - 1:
            path = _join(path, str(step))
    return path


def _join(path: str, step: str) -> str:
    return f"{path}{step}" if not path or step.startswith("[") else f"{path}.{step}"


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


def load_json(text: str | bytes, what: str) -> Any:
    """json.loads of client input, whose nesting past MAX_JSON_DEPTH (the decoder's own recursion
    limit included) is an InvalidRequest naming the limit; decoding errors go to the caller."""
    too_deep = InvalidRequest(f"{what} nests JSON deeper than {MAX_JSON_DEPTH} levels")
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
