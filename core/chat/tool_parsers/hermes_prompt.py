"""Tool calling on a template that does not render `tools` (SmolLM2's, plain ChatML...).

The tools are described in the system message in the Hermes format that HermesToolParser reads
back, and the tool history is written out in the same format: an assistant turn's calls as
``<tool_call>`` blocks in its content, and tool results as a user turn of ``<tool_response>``
blocks (the way Qwen3's own template renders them). So tool calling works on every model.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

INSTRUCTIONS = (
    "# Tools\n\n"
    "You can call functions to help with the user's request. Their signatures are listed below, "
    "one JSON object per line, between <tools> and </tools>:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, reply with a JSON object holding its name and its arguments between "
    "<tool_call> and </tool_call>, one block per call:\n"
    "<tool_call>\n{{\"name\": \"<function name>\", \"arguments\": <the arguments as a JSON object>}}\n</tool_call>"
)


def describe_tools(tool_specs: Sequence[dict[str, Any]]) -> str:
    return INSTRUCTIONS.format(tools="\n".join(json.dumps(t, ensure_ascii=False) for t in tool_specs))


def with_tools_described(messages: list[dict[str, Any]], tool_specs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The tool description appended to the leading system message, or as a new one."""
    description = describe_tools(tool_specs)
    if messages and messages[0]["role"] == "system":
        first = dict(messages[0], content=f"{messages[0]['content']}\n\n{description}")
        return [first, *messages[1:]]
    return [{"role": "system", "content": description}, *messages]


def inline_tool_history(messages: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Assistant tool calls and tool results as plain text turns in the Hermes format."""
    out: list[dict[str, Any]] = []
    for message in messages:
        if message["role"] == "assistant" and message.get("tool_calls"):
            blocks = [call_block(c["function"]["name"], c["function"]["arguments"]) for c in message["tool_calls"]]
            text = "\n".join(([message["content"]] if message["content"] else []) + blocks)
            out.append({k: v for k, v in message.items() if k != "tool_calls"} | {"content": text})
        elif message["role"] == "tool":
            block = f"<tool_response>\n{message['content']}\n</tool_response>"
            if out and out[-1].get("_tool_results"):
                out[-1]["content"] += "\n" + block
            else:
                out.append({"role": "user", "content": block, "_tool_results": True})
        else:
            out.append(message)
    return [{k: v for k, v in m.items() if k != "_tool_results"} for m in out]


def call_block(name: str, arguments: dict[str, Any]) -> str:
    return "<tool_call>\n" + json.dumps({"name": name, "arguments": arguments}, ensure_ascii=False) + "\n</tool_call>"
