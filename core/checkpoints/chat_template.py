"""Chat templates rendered with jinja2 the way transformers renders them: in the immutable
sandbox (a template is code that arrives with a checkpoint), trim_blocks/lstrip_blocks, and
``raise_exception`` / ``tojson`` / ``strftime_now`` available to the template."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Any, Sequence

import jinja2
import jinja2.sandbox


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
            separators: tuple[str, str] | None = None, sort_keys: bool = False) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(format: str) -> str:
    return datetime.now().strftime(format)


class ChatTemplate:
    def __init__(self, source: str) -> None:
        env = jinja2.sandbox.ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self._template = env.from_string(source)

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True, **context: Any) -> str:
        return self._template.render(messages=list(messages), add_generation_prompt=add_generation_prompt, **context)
