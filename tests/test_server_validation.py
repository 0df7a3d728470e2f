"""Bad requests: each gets its documented status and an OpenAI error body, never a 500, and
leaves nothing behind (no blocks, no queue entries)."""
from __future__ import annotations

import json
import threading
import time

import pytest
from server_fixtures import own_server
from stream_checks import parse_sse

MAX_SEQ_LEN = 256
HELLO = [{"role": "user", "content": "Hello"}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]


@pytest.fixture(scope="module")
def server(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny), "--max-seq-len", str(MAX_SEQ_LEN)])


def body(**fields) -> dict:
    return {"messages": HELLO, "max_tokens": 4, **fields}


def tool(**function) -> list[dict]:
    return [{"type": "function", "function": {"name": "f", **function}}]


def completion(**fields) -> dict:
    return {"prompt": "Hello", "max_tokens": 4, **fields}


def call_history(arguments: str) -> list[dict]:
    return [{"role": "user", "content": "Weather?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": arguments}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"}]


def nonfinite(name: str, literal: str) -> bytes:
    """Python's json module (unlike the JSON spec) reads NaN and Infinity literals."""
    return b'{"messages": [{"role": "user", "content": "Hello"}], "max_tokens": 4, "%s": %s}' % (
        name.encode(), literal.encode())


# (case id, method, path, body, expected status)
BAD_REQUESTS = [
    ("bad JSON", "POST", "/v1/chat/completions", b'{"messages": [', 400),
    ("body not UTF-8", "POST", "/v1/chat/completions", b'{"messages": "\xff"}', 400),
    ("JSON array body", "POST", "/v1/chat/completions", b"[1, 2]", 400),
    ("empty body", "POST", "/v1/chat/completions", b"", 400),
    ("no messages", "POST", "/v1/chat/completions", {"max_tokens": 4}, 400),
    ("empty messages", "POST", "/v1/chat/completions", body(messages=[]), 400),
    ("messages as string", "POST", "/v1/chat/completions", body(messages="Hello"), 400),
    ("message not an object", "POST", "/v1/chat/completions", body(messages=["Hello"]), 400),
    ("message without role", "POST", "/v1/chat/completions", body(messages=[{"content": "Hello"}]), 400),
    ("unknown role", "POST", "/v1/chat/completions", body(messages=[{"role": "wizard", "content": "Hi"}]), 400),
    ("content as number", "POST", "/v1/chat/completions", body(messages=[{"role": "user", "content": 5}]), 400),
    ("temperature as string", "POST", "/v1/chat/completions", body(temperature="0.5"), 400),
    ("max_tokens as bool", "POST", "/v1/chat/completions", body(max_tokens=True), 400),
    ("max_tokens as float", "POST", "/v1/chat/completions", body(max_tokens=2.5), 400),
    ("max_tokens as string", "POST", "/v1/chat/completions", body(max_tokens="4"), 400),
    ("negative max_tokens", "POST", "/v1/chat/completions", body(max_tokens=-1), 400),
    ("zero max_tokens", "POST", "/v1/chat/completions", body(max_tokens=0), 400),
    ("negative max_completion_tokens", "POST", "/v1/chat/completions", body(max_completion_tokens=-5), 400),
    ("temperature below 0", "POST", "/v1/chat/completions", body(temperature=-0.1), 400),
    ("temperature NaN", "POST", "/v1/chat/completions", nonfinite("temperature", "NaN"), 400),
    ("temperature Infinity", "POST", "/v1/chat/completions", nonfinite("temperature", "Infinity"), 400),
    ("top_p NaN", "POST", "/v1/chat/completions", nonfinite("top_p", "NaN"), 400),
    ("top_p 0", "POST", "/v1/chat/completions", body(top_p=0), 400),
    ("top_p above 1", "POST", "/v1/chat/completions", body(top_p=1.5), 400),
    ("top_p negative", "POST", "/v1/chat/completions", body(top_p=-0.5), 400),
    ("top_k negative", "POST", "/v1/chat/completions", body(top_k=-1), 400),
    ("seed as string", "POST", "/v1/chat/completions", body(seed="42"), 400),
    ("stream as string", "POST", "/v1/chat/completions", body(stream="yes"), 400),
    ("stop as number", "POST", "/v1/chat/completions", body(stop=7), 400),
    ("stop list with a number", "POST", "/v1/chat/completions", body(stop=["ok", 3]), 400),
    ("top_logprobs over 20", "POST", "/v1/chat/completions", body(logprobs=True, top_logprobs=21), 400),
    ("max_tokens over max_seq_len", "POST", "/v1/chat/completions", body(max_tokens=MAX_SEQ_LEN), 400),
    ("prompt over max_seq_len", "POST", "/v1/chat/completions",
     body(messages=[{"role": "user", "content": "word " * MAX_SEQ_LEN}], max_tokens=1), 400),
    ("n 0", "POST", "/v1/chat/completions", body(n=0), 400),
    ("n over 128", "POST", "/v1/chat/completions", body(n=129), 400),
    ("presence_penalty over 2", "POST", "/v1/chat/completions", body(presence_penalty=2.5), 400),
    ("frequency_penalty below -2", "POST", "/v1/chat/completions", body(frequency_penalty=-3), 400),
    ("repetition_penalty 0", "POST", "/v1/chat/completions", body(repetition_penalty=0), 400),
    ("logit_bias as array", "POST", "/v1/chat/completions", body(logit_bias=[1, 2]), 400),
    ("logit_bias key not a token id", "POST", "/v1/chat/completions", body(logit_bias={"abc": 1}), 400),
    ("logit_bias negative id", "POST", "/v1/chat/completions", body(logit_bias={"-1": 1}), 400),
    ("logit_bias id over vocab", "POST", "/v1/chat/completions", body(logit_bias={"999999": 1}), 400),
    ("logit_bias over 100", "POST", "/v1/chat/completions", body(logit_bias={"11": 101}), 400),
    ("min_p over 1", "POST", "/v1/chat/completions", body(min_p=1.5), 400),
    ("min_tokens over max_tokens", "POST", "/v1/chat/completions", body(min_tokens=5), 400),
    ("stop_token_ids not ids", "POST", "/v1/chat/completions", body(stop_token_ids=["a"]), 400),
    ("ignore_eos as string", "POST", "/v1/chat/completions", body(ignore_eos="yes"), 400),
    ("stream_options without stream", "POST", "/v1/chat/completions", body(stream_options={"include_usage": True}),
     400),
    ("tools as object", "POST", "/v1/chat/completions", body(tools={"type": "function"}), 400),
    ("tool without function", "POST", "/v1/chat/completions", body(tools=[{"type": "function"}]), 400),
    ("tool name with spaces", "POST", "/v1/chat/completions", body(tools=tool(name="get weather")), 400),
    ("tool parameters not a schema", "POST", "/v1/chat/completions", body(tools=tool(parameters={"type": "strang"})),
     400),
    ("tool parameters as string", "POST", "/v1/chat/completions", body(tools=tool(parameters="{}")), 400),
    ("same tool twice", "POST", "/v1/chat/completions", body(tools=TOOLS + TOOLS), 400),
    ("tool_choice names no offered tool", "POST", "/v1/chat/completions",
     body(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}}), 400),
    ("tool_choice required without tools", "POST", "/v1/chat/completions", body(tool_choice="required"), 400),
    ("tool_choice unknown", "POST", "/v1/chat/completions", body(tools=TOOLS, tool_choice="sometimes"), 400),
    ("response_format unknown type", "POST", "/v1/chat/completions", body(response_format={"type": "xml"}), 400),
    ("response_format as string", "POST", "/v1/chat/completions", body(response_format="json"), 400),
    ("json_schema without schema", "POST", "/v1/chat/completions",
     body(response_format={"type": "json_schema", "json_schema": {"name": "x"}}), 400),
    ("json_schema without name", "POST", "/v1/chat/completions",
     body(response_format={"type": "json_schema", "json_schema": {"schema": {"type": "object"}}}), 400),
    ("json_schema invalid schema", "POST", "/v1/chat/completions",
     body(response_format={"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 5}}}), 400),
    ("response_format with tool_choice required", "POST", "/v1/chat/completions",
     body(tools=TOOLS, tool_choice="required", response_format={"type": "json_object"}), 400),
    ("tool call arguments not JSON", "POST", "/v1/chat/completions", body(messages=call_history("{oops")), 400),
    ("tool call arguments not an object", "POST", "/v1/chat/completions", body(messages=call_history("[1]")), 400),
    ("tool message without tool_call_id", "POST", "/v1/chat/completions",
     body(messages=[{"role": "tool", "content": "sunny"}]), 400),
    ("tool_calls on a user message", "POST", "/v1/chat/completions",
     body(messages=[{"role": "user", "content": "x", "tool_calls": []}]), 400),
    ("user content null", "POST", "/v1/chat/completions", body(messages=[{"role": "user", "content": None}]), 400),
    ("chat_template_kwargs as list", "POST", "/v1/chat/completions", body(chat_template_kwargs=[1]), 400),
    ("chat_template_kwargs setting messages", "POST", "/v1/chat/completions",
     body(chat_template_kwargs={"messages": []}), 400),
    ("reasoning_effort unknown", "POST", "/v1/chat/completions", body(reasoning_effort="extreme"), 400),
    ("completions: no prompt", "POST", "/v1/completions", {"max_tokens": 4}, 400),
    ("completions: prompt as number", "POST", "/v1/completions", completion(prompt=5), 400),
    ("completions: mixed prompt list", "POST", "/v1/completions", completion(prompt=["a", 1]), 400),
    ("completions: token id over vocab", "POST", "/v1/completions", completion(prompt=[1, 999999]), 400),
    ("completions: negative token id", "POST", "/v1/completions", completion(prompt=[[5, 6], [-1]]), 400),
    ("completions: echo", "POST", "/v1/completions", completion(echo=True), 400),
    ("completions: suffix", "POST", "/v1/completions", completion(suffix="!"), 400),
    ("completions: logprobs over 20", "POST", "/v1/completions", completion(logprobs=21), 400),
    ("completions: best_of", "POST", "/v1/completions", completion(best_of=3), 400),
    ("completions: too long", "POST", "/v1/completions", completion(max_tokens=MAX_SEQ_LEN), 400),
    ("completions: unknown model", "POST", "/v1/completions", completion(model="gpt-4o"), 404),
    ("tokenize: no prompt or messages", "POST", "/tokenize", {}, 400),
    ("content part type not a string", "POST", "/v1/chat/completions",
     body(messages=[{"role": "user", "content": [{"type": {"text": 1}, "text": "hi"}]}]), 400),
    ("tokenize: content part type not a string", "POST", "/tokenize",
     {"messages": [{"role": "user", "content": [{"type": ["text"], "text": "hi"}]}]}, 400),
    ("tokenize: both prompt and messages", "POST", "/tokenize", {"prompt": "a", "messages": HELLO}, 400),
    ("tokenize: a prompt with chat_template_kwargs not an object", "POST", "/tokenize",
     {"prompt": "a", "chat_template_kwargs": False}, 400),
    ("tokenize: a prompt with tools not an array", "POST", "/tokenize", {"prompt": "a", "tools": {}}, 400),
    ("detokenize: id over vocab", "POST", "/detokenize", {"tokens": [1, 999999]}, 400),
    ("detokenize: tokens as string", "POST", "/detokenize", {"tokens": "abc"}, 400),
    ("priority under fcfs", "POST", "/v1/chat/completions", body(priority=1), 400),
    ("priority as string", "POST", "/v1/chat/completions", body(priority="high"), 400),
    ("priority as float", "POST", "/v1/chat/completions", body(priority=0.5), 400),
    ("unknown model", "POST", "/v1/chat/completions", body(model="gpt-4o"), 404),
    ("huge body", "POST", "/v1/chat/completions",
     body(messages=[{"role": "user", "content": "x" * (5 * 2**20)}]), 413),
    ("unknown route", "GET", "/v1/nothing-here", None, 404),
    ("unknown POST route", "POST", "/v1/completions-typo", body(), 404),
    ("GET on chat completions", "GET", "/v1/chat/completions", None, 405),
    ("GET on completions", "GET", "/v1/completions", None, 405),
    ("POST on health", "POST", "/health", body(), 405),
    ("DELETE on metrics", "DELETE", "/metrics", None, 405),
]


# The field each rejection must name in error.param (a sample of the cases above).
NAMED_FIELDS = {
    "n over 128": "n", "presence_penalty over 2": "presence_penalty", "repetition_penalty 0": "repetition_penalty",
    "logit_bias id over vocab": "logit_bias", "min_p over 1": "min_p", "min_tokens over max_tokens": "min_tokens",
    "tool name with spaces": "tools[0].function.name", "tool parameters not a schema": "tools[0].function.parameters",
    "same tool twice": "tools[1].function.name", "tool_choice names no offered tool": "tool_choice",
    "response_format unknown type": "response_format.type",
    "json_schema without schema": "response_format.json_schema.schema",
    "json_schema invalid schema": "response_format.json_schema.schema",
    "tool call arguments not JSON": "messages[1].tool_calls[0].function.arguments",
    "tool message without tool_call_id": "messages[0].tool_call_id", "user content null": "messages[0].content",
    "unknown role": "messages[0].role", "completions: negative token id": "prompt[1]", "completions: echo": "echo",
    "detokenize: id over vocab": "tokens",
}


def assert_openai_error(status: int, headers: dict, raw: bytes, expected_status: int) -> dict:
    assert status == expected_status, f"HTTP {status} (expected {expected_status}): {raw[:300]!r}"
    assert headers["content-type"].split(";")[0].strip() == "application/json", headers
    error = json.loads(raw)["error"]
    assert isinstance(error["message"], str) and error["message"], error
    assert error["type"] == "invalid_request_error", error
    assert "Traceback" not in error["message"]
    return error


@pytest.mark.parametrize("method, path, payload, expected", [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request_gets_documented_error(server, method, path, payload, expected):
    status, headers, raw = server.request(method, path, payload)
    assert_openai_error(status, headers, raw, expected)


@pytest.mark.parametrize("case", NAMED_FIELDS)
def test_rejection_names_the_field(server, case):
    method, path, payload, expected = next(c[1:] for c in BAD_REQUESTS if c[0] == case)
    status, headers, raw = server.request(method, path, payload)
    error = assert_openai_error(status, headers, raw, expected)
    assert error["param"] == NAMED_FIELDS[case] and NAMED_FIELDS[case] in error["message"], error


@pytest.mark.parametrize("fields", [
    {"temperature": -1},
    {"max_tokens": MAX_SEQ_LEN},
    {"messages": []},
    {"n": 0},
    {"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
], ids=["temperature", "too long", "no messages", "n", "tool_choice"])
def test_bad_streaming_request_gets_json_not_sse(server, fields):
    status, headers, raw = server.request("POST", "/v1/chat/completions", body(stream=True, **fields))
    assert not raw.startswith(b"data:")
    assert_openai_error(status, headers, raw, 400)


@pytest.mark.parametrize("fields", [
    {"temperature": 2.0},
    {"temperature": 1.0, "top_p": 1e-9},
    {"temperature": 1.0, "top_k": 1},
    {"temperature": 1.0, "top_k": 10**12},
    {"max_completion_tokens": 3},
    {"stop": ["a"] * 16},
    {"logprobs": True, "top_logprobs": 20},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": "Hel"}, {"type": "text", "text": "lo"}]}]},
    {"priority": 0},
], ids=["temperature 2", "top_p tiny", "top_k 1", "top_k huge", "max_completion_tokens",
        "16 stops", "top_logprobs 20", "content parts", "priority 0 under fcfs"])
def test_valid_edge_values_are_served(server, fields):
    status, _, raw = server.chat(body(**fields))
    assert status == 200, raw
    reply = json.loads(raw)
    assert reply["choices"][0]["finish_reason"] in ("stop", "length") and reply["usage"]["completion_tokens"] >= 1


def test_near_zero_temperature_samples_the_greedy_answer(server):
    status, _, greedy = server.chat(body(temperature=0, max_tokens=8))
    assert status == 200, greedy
    for temperature in (1e-6, 1e-30, 1e-300):
        status, _, raw = server.chat(body(temperature=temperature, seed=3, max_tokens=8))
        assert status == 200, f"temperature {temperature}: {raw[:200]!r}"
        assert json.loads(raw)["choices"][0]["message"] == json.loads(greedy)["choices"][0]["message"]


def test_a_bad_request_does_not_disturb_a_running_one(server):
    """A request that the engine cannot sample must fail alone (or, better, be refused up
    front), never take the other running requests down with it."""
    done: dict = {}
    max_tokens = 60
    before = server.wait_until_idle()
    runner = threading.Thread(target=lambda: done.update(
        reply=server.chat(body(stream=True, max_tokens=max_tokens, messages=[{"role": "user", "content": "Go on."}]))))
    runner.start()
    deadline = time.monotonic() + 20
    while not (m := server.metrics())["requests_active"] or m["decode_tokens_total"] == before["decode_tokens_total"]:
        assert time.monotonic() < deadline, "the long request never started decoding"
        time.sleep(0.02)
    statuses = [server.request("POST", "/v1/chat/completions", nonfinite("temperature", "NaN"))[0],
                server.chat(body(temperature=1e-300))[0]]
    runner.join(timeout=120)
    status, _, raw = done["reply"]
    payloads = parse_sse(raw)
    chunks = [json.loads(p) for p in payloads[:-1]]
    assert not any("error" in c for c in chunks), f"the running stream was failed: {payloads[-2]}"
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert chunks[-1]["usage"]["completion_tokens"] == max_tokens
    assert all(s < 500 for s in statuses), statuses


def test_length_limit_is_exact(server):
    """prompt + max_tokens == max_seq_len is served; one token more is refused."""
    long_prompt = [{"role": "user", "content": "word " * (MAX_SEQ_LEN - 40)}]
    status, _, raw = server.chat(body(messages=long_prompt, max_tokens=1))
    assert status == 200, raw
    prompt_tokens = json.loads(raw)["usage"]["prompt_tokens"]
    assert prompt_tokens < MAX_SEQ_LEN
    status, _, raw = server.chat(body(messages=long_prompt, max_tokens=MAX_SEQ_LEN - prompt_tokens))
    assert status == 200, raw
    status, headers, raw = server.chat(body(messages=long_prompt, max_tokens=MAX_SEQ_LEN - prompt_tokens + 1))
    assert_openai_error(status, headers, raw, 400)


@pytest.mark.parametrize("route", ["/v1/chat/completions", "/v1/completions"])
def test_an_omitted_max_tokens_fits_what_the_prompt_leaves(server, route):
    """Without max_tokens the default (256 for chat, over this server's room) shrinks to fit,
    as in vLLM; the same count asked for explicitly is refused (test_length_limit_is_exact)."""
    chat = route.endswith("chat/completions")
    prompt = {"messages": [{"role": "user", "content": "word " * (MAX_SEQ_LEN - 40)}]} if chat else {
        "prompt": [100] * (MAX_SEQ_LEN - 8)}  # leaves less than the default of 16
    status, _, raw = server.request("POST", route, {**prompt, "ignore_eos": True})
    assert status == 200, raw
    reply = json.loads(raw)
    room = MAX_SEQ_LEN - reply["usage"]["prompt_tokens"]
    assert room < (256 if chat else 16)
    assert reply["usage"]["completion_tokens"] == room
    assert reply["choices"][0]["finish_reason"] == "length"


def test_wrong_method_names_the_allowed_one(server):
    status, headers, _ = server.request("GET", "/v1/chat/completions")
    assert status == 405 and "POST" in headers.get("allow", "")


def test_nothing_leaks_and_the_server_still_answers(server):
    statuses = {case: server.request(method, path, payload)[0]  # the whole table again, back to back
                for case, method, path, payload, _ in BAD_REQUESTS}
    m = server.wait_until_idle(timeout_s=5.0)
    assert m["kv_blocks_used"] == m["kv_blocks_cached"] and m["requests_active"] == 0 and m["queue_depth"] == 0
    server.assert_still_serving()
    assert not {case: s for case, s in statuses.items() if s >= 500}, "bad input answered with a server error"


@pytest.mark.parametrize("part", [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                                  {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}}])
def test_an_image_or_audio_part_is_refused_by_name(server, part):
    """A multimodal checkpoint (Qwen3.5) is served as its text model: its image parts are a 400
    that says so, naming the part, not a complaint that the part's type is not "text"."""
    content = [{"type": "text", "text": "What is in this picture?"}, part]
    status, headers, raw = server.request("POST", "/v1/chat/completions",
                                          body(messages=[{"role": "user", "content": content}]))
    error = assert_openai_error(status, headers, raw, 400)
    assert f"{part['type']} content parts are not supported" in error["message"], error
    assert error["param"].startswith("messages[0].content[1]"), error
