"""The offline API takes the same chat features as the server: LLM.chat renders tools and
template arguments through the same ChatFormat and parses replies with the same parsers.
Replies come from the scripted backend (tests/scripted_backend.py), so they are known exactly."""
from __future__ import annotations

import json

import pytest
import tokenizers
from scripted_backend import SCRIPTS_ENV

from qwen_serve import LLM, SamplingParams
from qwen_serve.conformance.models import IM_END
from qwen_serve.registry import load_registry

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]
QUESTION = [{"role": "user", "content": "Weather in Paris?"}]
CALL = ['<tool_call>', '\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n', '</tool_call>']


def scripted_llm(model: str, tokenizer_encode, scripts: list[list[str]], end_token: int, tmp_path) -> LLM:
    path = tmp_path / "scripts.json"
    path.write_text(json.dumps([[t for piece in s for t in tokenizer_encode(piece)] + [end_token] for s in scripts]))
    with pytest.MonkeyPatch.context() as env:
        env.setenv(SCRIPTS_ENV, str(path))
        registry = load_registry(env={"QWEN_SERVE_PLUGINS": "", "QWEN_SERVE_PLUGIN_MODULES": "scripted_backend"})
        return LLM(model, backend="scripted", registry=registry)


@pytest.fixture(scope="module")
def qwen3(qwen3_tiny, tmp_path_factory) -> LLM:
    backend = tokenizers.Tokenizer.from_file(str(qwen3_tiny / "tokenizer.json"))
    scripts = [["<think>", "\nThe tool knows.\n", "</think>", "\n\n", *CALL], ["Just text."]]
    return scripted_llm(str(qwen3_tiny), lambda s: backend.encode(s, add_special_tokens=False).ids, scripts, IM_END,
                        tmp_path_factory.mktemp("qwen3-scripts"))


def test_chat_with_tools_parses_reasoning_and_tool_calls(qwen3):
    out = qwen3.chat(QUESTION, SamplingParams(seed=0), tools=TOOLS)[0]
    assert out.finish_reason == "stop"
    assert out.message.reasoning_content == "The tool knows."
    assert out.message.content is None
    assert [(c.name, json.loads(c.arguments)) for c in out.message.tool_calls] == [("get_weather", {"city": "Paris"})]
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in qwen3.tokenizer.decode(out.prompt_token_ids)


def test_chat_template_kwargs_reach_the_template(qwen3):
    out = qwen3.chat(QUESTION, SamplingParams(seed=1), chat_template_kwargs={"enable_thinking": False})[0]
    closed = qwen3.tokenizer.encode("<|im_start|>assistant\n<think>\n\n</think>\n\n", add_special_tokens=False)
    assert out.prompt_token_ids[-len(closed):] == closed
    assert (out.message.content, out.message.reasoning_content, out.message.tool_calls) == ("Just text.", None, ())
    assert out.text == "Just text."


def test_smollm2_calls_tools_through_the_hermes_fallback(smollm2_path, tmp_path):
    from qwen_serve.checkpoints.checkpoint import load_checkpoint

    tokenizer = load_checkpoint(smollm2_path).tokenizer
    eos = tokenizer.token_to_id("<|im_end|>")
    llm = scripted_llm(str(smollm2_path), lambda s: tokenizer.encode(s, add_special_tokens=False),
                       [["Let me look.", "\n", *CALL]], eos, tmp_path)
    out = llm.chat(QUESTION, SamplingParams(seed=0), tools=TOOLS)[0]
    assert "<tools>\n" + json.dumps(TOOLS[0]) + "\n</tools>" in llm.tokenizer.decode(out.prompt_token_ids)
    assert out.message.content == "Let me look."
    assert [(c.name, json.loads(c.arguments)) for c in out.message.tool_calls] == [("get_weather", {"city": "Paris"})]
