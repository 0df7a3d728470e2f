"""Replies with n choices, JSON and streamed, through the real aiohttp app and `openai` client.

The engine refuses n > 1 until copy-on-write forking lands, so here a stand-in for AsyncEngine
delivers what the engine will: outputs for choices 0..n-1 interleaved, each choice finishing on
its own, the request done when all have. Everything above the engine is the real server.
"""
from __future__ import annotations

import asyncio
import json
from types import SimpleNamespace

import openai
import pytest
import tokenizers
from aiohttp import web
from chat_stream import JoinedStream, reply_message
from prometheus_client import CollectorRegistry

from qwen_serve.bench.launcher import LOOPBACK, free_port
from qwen_serve.checkpoints.tokenizer import Tokenizer
from qwen_serve.conformance.models import QWEN3_CHAT_TEMPLATE
from qwen_serve.conformance.qwen_tokenizer import qwen_tokenizer_json_path
from qwen_serve.engine.detokenizer import IncrementalDetokenizer
from qwen_serve.engine.outputs import RequestOutput
from qwen_serve.server.app import ChatServer, ServerInfo, ServerOptions
from qwen_serve.server.prometheus import RequestMetrics

SCRIPTS = [  # choice i answers with SCRIPTS[i]
    "<think>\nFirst choice thinks.\n</think>\n\nFirst answer.",
    '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Rome"}}\n</tool_call>',
    "Third choice, plain and a little longer than the others.",
]
EXPECTED = [
    {"reasoning_content": "First choice thinks.", "content": "First answer.", "tool_calls": []},
    {"reasoning_content": None, "content": None, "tool_calls": [("get_weather", {"city": "Rome"})]},
    {"reasoning_content": None, "content": SCRIPTS[2], "tool_calls": []},
]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}}}}]
CACHED = 16


class InterleavedChoices:
    """Stands in for AsyncEngine: choice i of every request spells SCRIPTS[i] one token per output."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.engine = SimpleNamespace(model_config=SimpleNamespace(vocab_size=151936), max_seq_len=4096)
        self.requests: list[tuple[str, int]] = []

    def is_alive(self) -> bool:
        return True

    def generate(self, request_id, prompt, params, arrival_time, priority=0):
        self.requests.append((request_id, params.n))
        return self._outputs(request_id, params.n)

    async def _outputs(self, request_id: str, n: int):
        scripts = [self.tokenizer.encode(SCRIPTS[i], add_special_tokens=False) for i in range(n)]
        detokenizers = [IncrementalDetokenizer(self.tokenizer.decode) for _ in range(n)]
        for position in range(max(len(s) for s in scripts)):
            for i, script in enumerate(scripts):
                if position < len(script):
                    await asyncio.sleep(0)
                    detokenizers[i].add(script[position])
                    last = position == len(script) - 1
                    yield RequestOutput(request_id, [script[position]], detokenizers[i].release(final=last), last,
                                        "stop" if last else None, [None], index=i, num_cached_tokens=CACHED)


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    backend = tokenizers.Tokenizer.from_file(str(qwen_tokenizer_json_path()))
    return Tokenizer(backend, QWEN3_CHAT_TEMPLATE, None, "<|im_end|>")


def served(tokenizer, scenario):
    """Runs scenario(client, engine) against the real app around the stand-in engine."""
    async def main():
        engine = InterleavedChoices(tokenizer)
        info = ServerInfo("stand-in", (), "none", "none", 16, 512, 8)
        registry = CollectorRegistry(auto_describe=False)
        server = ChatServer(ServerOptions(), registry)
        server.attach(engine, tokenizer, info, RequestMetrics(registry, info.model))
        runner = web.AppRunner(server.make_app())
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, LOOPBACK, port).start()
        try:
            async with openai.AsyncOpenAI(base_url=f"http://{LOOPBACK}:{port}/v1", api_key="x", max_retries=0) as c:
                return await scenario(c, engine)
        finally:
            await runner.cleanup()

    return asyncio.run(main())


async def collect(stream):
    return [chunk async for chunk in stream]


def test_n_chat_choices_as_json_and_as_a_stream(tokenizer):
    async def scenario(client, engine):
        kw = dict(model="stand-in", messages=[{"role": "user", "content": "Weather?"}], n=3, tools=TOOLS)
        reply = await client.chat.completions.create(**kw)
        plain = await collect(await client.chat.completions.create(stream=True, **kw))
        with_usage = await collect(await client.chat.completions.create(
            stream=True, stream_options={"include_usage": True}, **kw))
        return reply, plain, with_usage, engine.requests

    reply, plain, with_usage, requests = served(tokenizer, scenario)
    assert [n for _, n in requests] == [3, 3, 3]
    assert [c.index for c in reply.choices] == [0, 1, 2]
    assert [reply_message(c.message) for c in reply.choices] == EXPECTED
    assert [c.finish_reason for c in reply.choices] == ["stop", "tool_calls", "stop"]
    tokens = sum(len(tokenizer.encode(s, add_special_tokens=False)) for s in SCRIPTS)
    assert reply.usage.completion_tokens == tokens and reply.usage.prompt_tokens_details.cached_tokens == CACHED

    for chunks, include_usage in ((plain, False), (with_usage, True)):
        joined = JoinedStream(chunks, include_usage=include_usage)
        assert sorted(joined.choices) == [0, 1, 2]
        assert [joined.choices[i].message() for i in range(3)] == EXPECTED
        assert [joined.choices[i].finish_reason for i in range(3)] == ["stop", "tool_calls", "stop"]
        assert joined.usage.completion_tokens == tokens
        first_finish = min(i for i, c in enumerate(chunks) if c.choices and c.choices[0].finish_reason)
        assert first_finish < len(chunks) - 2, "choices finish on their own, before the reply ends"
        assert all(len(c.choices) <= 1 for c in chunks)


def test_n_legacy_choices_of_several_prompts(tokenizer):
    async def scenario(client, engine):
        reply = await client.completions.create(model="stand-in", prompt=["a", "b"], n=2, max_tokens=40)
        chunks = await collect(await client.completions.create(model="stand-in", prompt=["a", "b"], n=2,
                                                               max_tokens=40, stream=True))
        return reply, chunks

    reply, chunks = served(tokenizer, scenario)
    # choice i of prompt p is choice p * n + i
    assert [(c.index, c.text) for c in reply.choices] == [(0, SCRIPTS[0]), (1, SCRIPTS[1]), (2, SCRIPTS[0]),
                                                          (3, SCRIPTS[1])]
    joined = JoinedStream(chunks)
    assert {i: "".join(c.text) for i, c in joined.choices.items()} == {0: SCRIPTS[0], 1: SCRIPTS[1], 2: SCRIPTS[0],
                                                                      3: SCRIPTS[1]}
    assert joined.usage.completion_tokens == reply.usage.completion_tokens
    assert reply.usage.prompt_tokens_details.cached_tokens == 2 * CACHED  # summed over the two prompts
    assert json.loads(reply.model_dump_json())["object"] == "text_completion"
