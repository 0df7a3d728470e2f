"""The thinking budget: a think block that reaches its budget is closed by the engine with Qwen's
early-exit sentence, ``</think>`` and a blank line, and the answer follows. The engine's rule on
a random Qwen3 with the real sampler; then each API's way to ask for it (Anthropic's
budget_tokens, a reasoning effort, the server's --reasoning-budget) on a server whose template
opens the think block in the generation prompt, as Qwen3.5's does."""
from __future__ import annotations

import json
import shutil

import pytest
from server_fixtures import own_server

from qwen_serve.engine.llm import LLM
from qwen_serve.logits.thinking_budget import EXIT_TEXT, ThinkingBudget
from qwen_serve.sampling.params import SamplingParams

EXIT_SENTENCE = EXIT_TEXT.strip()


@pytest.fixture(scope="module")
def llm(qwen3_tiny):
    return LLM(str(qwen3_tiny))


def think_open_prompt(llm: LLM) -> list[int]:
    t = llm.tokenizer
    return (t.encode_chat([{"role": "user", "content": "hi"}]) + [t.token_to_id("<think>")]
            + t.encode("\n", add_special_tokens=False))


def closing(llm: LLM) -> list[int]:
    return ThinkingBudget(llm.engine.model_config, llm.tokenizer).closing


@pytest.mark.parametrize("budget", [0, 5])
@pytest.mark.parametrize("temperature", [0.0, 0.9])
def test_the_block_closes_at_its_budget(llm, budget, temperature):
    out = llm.generate([think_open_prompt(llm)], SamplingParams(max_tokens=60, thinking_budget=budget,
                                                                temperature=temperature, seed=1))[0]
    forced = closing(llm)
    assert out.token_ids[budget:budget + len(forced)] == forced
    assert len(out.token_ids) > budget + len(forced)  # the answer follows
    assert llm.tokenizer.token_to_id("</think>") not in out.token_ids[:budget]


def test_no_budget_or_a_closed_block_changes_nothing(llm):
    prompt = think_open_prompt(llm)
    free = llm.generate([prompt], SamplingParams(max_tokens=40))[0].token_ids
    assert free == llm.generate([prompt], SamplingParams(max_tokens=40, thinking_budget=100))[0].token_ids
    closed = llm.tokenizer.encode_chat([{"role": "user", "content": "hi"}], enable_thinking=False)
    assert (llm.generate([closed], SamplingParams(max_tokens=40))[0].token_ids
            == llm.generate([closed], SamplingParams(max_tokens=40, thinking_budget=3))[0].token_ids)


def test_a_block_the_reply_opens_counts_from_there(llm):
    """Qwen3 writes <think> itself: the state machine counts from that token on."""
    budget = ThinkingBudget(llm.engine.model_config, llm.tokenizer)
    t = llm.tokenizer
    state = budget.start(type("R", (), {"prompt_token_ids": [1, 2, 3], "output_token_ids": [],
                                        "params": SamplingParams(thinking_budget=2)})())
    assert state.adjust(None) is None
    for token in (t.token_to_id("<think>"), 100, 101):
        state.accept(token)
    mask = state.adjust(None).allowed.view("uint32")
    allowed = [i * 32 + b for i, word in enumerate(mask) for b in range(32) if word >> b & 1]
    assert allowed == [budget.closing[0]]


@pytest.fixture(scope="module")
def opening_template_model(qwen3_tiny, tmp_path_factory):
    """qwen3_tiny with a generation prompt that opens the think block unless thinking is off."""
    path = tmp_path_factory.mktemp("opens-think") / "qwen3"
    shutil.copytree(qwen3_tiny, path)
    config = json.loads((path / "tokenizer_config.json").read_text())
    closed = "{{- '<think>\\n\\n</think>\\n\\n' }}\n"
    assert closed in config["chat_template"]
    config["chat_template"] = config["chat_template"].replace(closed, closed + "    {%- else %}{{- '<think>\\n' }}\n")
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


@pytest.fixture(scope="module")
def server(opening_template_model):
    yield from own_server(["--model", str(opening_template_model), "--reasoning-budget", "6"])


def test_every_api_closes_the_block(server):
    ask = [{"role": "user", "content": "hi"}]
    status, _, body = server.request("POST", "/v1/messages", {
        "model": "any", "max_tokens": 60, "messages": ask, "thinking": {"type": "enabled", "budget_tokens": 3}})
    assert status == 200, body
    thinking = json.loads(body)["content"][0]
    assert thinking["type"] == "thinking" and thinking["thinking"].endswith(EXIT_SENTENCE), thinking

    status, _, body = server.request("POST", "/v1/chat/completions", {"messages": ask, "max_tokens": 60})
    assert status == 200, body  # the server's --reasoning-budget
    assert json.loads(body)["choices"][0]["message"]["reasoning_content"].endswith(EXIT_SENTENCE)

    status, _, body = server.request("POST", "/v1/responses", {"input": "hi", "max_output_tokens": 60,
                                                               "reasoning": {"effort": "high"}, "store": False})
    assert status == 200, body
    reasoning = json.loads(body)["output"][0]
    assert reasoning["type"] == "reasoning" and reasoning["content"][0]["text"].endswith(EXIT_SENTENCE)
