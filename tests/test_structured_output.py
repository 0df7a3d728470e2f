"""Structured output on SmolLM2: sampled outputs parse and validate against their
schema, tool calls are Hermes blocks of an offered tool, constrained and free requests share a
batch without changing each other, the mask waits for after_token_id, and a schema the grammar
library cannot compile is an InvalidRequest naming the part."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from qwen_serve import LLM, SamplingParams
from qwen_serve.errors import InvalidRequest
from qwen_serve.sampling.params import StructuredOutput

SCHEMAS = {
    "nested objects": {"type": "object", "properties": {
        "name": {"type": "string", "maxLength": 24},
        "address": {"type": "object", "properties": {"street": {"type": "string", "maxLength": 32},
                                                     "city": {"type": "string", "maxLength": 24}},
                    "required": ["street", "city"]}},
        "required": ["name", "address"]},
    "arrays": {"type": "object", "properties": {
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 16}, "minItems": 1, "maxItems": 4},
        "scores": {"type": "array", "items": {"type": "integer"}, "maxItems": 5}},
        "required": ["tags", "scores"]},
    "enums": {"type": "object", "properties": {
        "color": {"enum": ["red", "green", "blue"]}, "size": {"type": "string", "enum": ["S", "M", "L"]},
        "count": {"type": "integer", "minimum": 1, "maximum": 9}},
        "required": ["color", "size", "count"]},
    "required and optional fields": {"type": "object", "properties": {
        "id": {"type": "integer"}, "title": {"type": "string", "maxLength": 30}, "done": {"type": "boolean"},
        "note": {"type": "string", "maxLength": 20}},
        "required": ["id", "done"]},
    "string patterns": {"type": "object", "properties": {
        "code": {"type": "string", "pattern": "^[A-Z]{3}-[0-9]{3}$"},
        "date": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"}},
        "required": ["code", "date"]},
}
WEATHER = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 30},
                                            "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"]}
SEARCH = {"type": "object", "properties": {"query": {"type": "string", "maxLength": 40},
                                           "limit": {"type": "integer", "minimum": 1, "maximum": 10}},
          "required": ["query"]}
TOOLS = (("get_weather", json.dumps(WEATHER)), ("search", json.dumps(SEARCH)))
HERMES = re.compile(r"<tool_call>\n(.*?)\n</tool_call>", re.S)


@pytest.fixture(scope="module")
def llm(smollm2_path):
    return LLM(str(smollm2_path))


def _opens_a_call(text: str) -> bool:
    opening = '<tool_call>\n{"name": "'
    return text.startswith(opening) or opening.startswith(text)


def chat(llm, text):
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}])


def sampled(structured, seed, **extra):
    return SamplingParams(temperature=0.8, seed=seed, max_tokens=96, structured=structured, **extra)


def test_sampled_json_validates_against_every_schema(llm):
    requests = [(f"{name}-{seed}", chat(llm, f"Give me an example as JSON: {name}."),
                 sampled(StructuredOutput.json_schema(schema), seed))
                for name, schema in SCHEMAS.items() for seed in range(3)]
    seqs = llm.engine.run(requests)  # all fifteen in one batch stream
    for (request_id, _, _), seq in zip(requests, seqs):
        name = request_id.rsplit("-", 1)[0]
        assert seq.finish_reason == "stop", (request_id, seq.detokenizer.text)
        jsonschema.validate(json.loads(seq.detokenizer.text), SCHEMAS[name])
    assert llm.parts.cache.usage().used == llm.parts.cache.usage().cached


def test_json_object_parses(llm):
    for seed in range(3):
        out = llm.generate([chat(llm, "Describe your favourite book.")], sampled(StructuredOutput("json_object"), seed))[0]
        assert out.finish_reason == "stop"
        assert isinstance(json.loads(out.text), dict)


@pytest.mark.parametrize("tools", [TOOLS, TOOLS[:1]], ids=["choice of two", "one required"])
def test_tool_calls_are_hermes_calls_of_an_offered_tool(llm, tools):
    """SmolLM2 was never taught to stop after a call, so now and then it repeats calls until
    max_tokens: every complete block must still be a valid call, and what follows the last one
    the start of another."""
    schemas = {name: json.loads(parameters) for name, parameters in tools}
    names, finished = set(), 0
    prompt = chat(llm, "What is the weather in Paris? Then search for museums.")
    structured = StructuredOutput("tool_calls", tools=tools)
    for out in llm.generate([prompt] * 8, [sampled(structured, seed) for seed in range(8)]):
        calls = HERMES.findall(out.text)
        rest = HERMES.sub("", out.text).strip()
        assert calls and (rest == "" if out.finish_reason == "stop" else _opens_a_call(rest))
        finished += out.finish_reason == "stop"
        for call in map(json.loads, calls):
            assert set(call) == {"name", "arguments"} and call["name"] in schemas
            jsonschema.validate(call["arguments"], schemas[call["name"]])
            names.add(call["name"])
    assert finished >= 2
    if len(tools) == 1:
        assert names == {tools[0][0]}


def test_constrained_and_free_requests_in_one_batch_equal_running_alone(llm):
    prompts = [chat(llm, "Give me an example as JSON: enums."), chat(llm, "Tell me about cats."),
               chat(llm, "Give me an example as JSON: arrays.")]
    params = [sampled(StructuredOutput.json_schema(SCHEMAS["enums"]), 5), SamplingParams(temperature=0.8, seed=5,
              max_tokens=40), sampled(StructuredOutput.json_schema(SCHEMAS["arrays"]), 6)]
    alone = [llm.engine.run([(f"alone-{i}", p, q)])[0].output_token_ids for i, (p, q) in enumerate(zip(prompts, params))]
    together = llm.engine.run([(f"together-{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params))])
    assert [s.output_token_ids for s in together] == alone
    json.loads(together[0].detokenizer.text)
    with pytest.raises(ValueError):
        json.loads(together[1].detokenizer.text)  # the free one is prose


def test_the_mask_starts_after_after_token_id(llm):
    prompt = chat(llm, "Tell me about cats.")
    free = llm.generate([prompt], SamplingParams(max_tokens=12))[0].token_ids
    trigger = free[3]
    assert trigger not in free[:3]
    structured = StructuredOutput("json_schema", json.dumps(SCHEMAS["enums"]), after_token_id=trigger)
    out = llm.generate([prompt], SamplingParams(max_tokens=64, structured=structured))[0]
    assert out.token_ids[:4] == free[:4]  # unconstrained until the trigger
    head = llm.tokenizer.decode(free[:4])
    assert out.text.startswith(head) and out.finish_reason == "stop"
    jsonschema.validate(json.loads(out.text[len(head):]), SCHEMAS["enums"])
    # a trigger that never comes: no constraint at all
    never = StructuredOutput("json_object", after_token_id=llm.tokenizer.encode("zebra")[0])
    assert llm.generate([prompt], SamplingParams(max_tokens=12, structured=never))[0].token_ids == free


@pytest.mark.parametrize("extra", [{"min_tokens": 60}, {"ignore_eos": True}])
def test_a_complete_document_ends_the_request_even_when_eos_is_held_back(llm, extra):
    schema = StructuredOutput.json_schema(SCHEMAS["enums"])
    out = llm.generate([chat(llm, "Give me an example as JSON: enums.")],
                       SamplingParams(max_tokens=80, structured=schema, **extra))[0]
    assert out.finish_reason == "stop" and len(out.token_ids) < 60
    jsonschema.validate(json.loads(out.text), SCHEMAS["enums"])


@pytest.mark.parametrize("structured, needle", [
    (StructuredOutput.json_schema({"type": "array", "uniqueItems": True}), 'response_format json_schema: Unimplemented keys: ["uniqueItems"]'),
    (StructuredOutput.json_schema({"type": "string", "pattern": "a(?=b)"}), "look-around"),
    (StructuredOutput.json_schema({"type": "strin"}), "Invalid type: strin"),
    (StructuredOutput("json_schema", "{not json"), "not valid JSON"),
    (StructuredOutput("tool_calls", tools=(("ok", "{}"), ("broken", '{"type": "object", "if": {}}'))),
     "tool 'broken' parameters: Unimplemented keys: [\"if\"]"),
])
def test_a_schema_the_library_cannot_compile_is_an_invalid_request(llm, structured, needle):
    prompt = chat(llm, "Hi")
    with pytest.raises(InvalidRequest) as exc:
        llm.engine.check_request(prompt, SamplingParams(structured=structured))
    assert needle in str(exc.value)
    assert exc.value.param in ("response_format", "tools")
    with pytest.raises(InvalidRequest):
        llm.generate([prompt], SamplingParams(structured=structured))
    assert not llm.engine.has_unfinished() and llm.engine.sequences == {}


def test_constrained_output_survives_preemption(qwen3_tiny):
    """A tiny KV pool preempts and recomputes; the grammar state follows tokens, not the cache."""
    schema = StructuredOutput.json_schema(SCHEMAS["arrays"])
    big = LLM(str(qwen3_tiny), prefix_cache=False)
    prompts = [big.tokenizer.encode(f"request {i}: " + "words " * (6 + 5 * i)) for i in range(6)]
    params = [SamplingParams(temperature=0.9, seed=i, max_tokens=40, structured=schema) if i % 2 == 0
              else SamplingParams(temperature=0.9, seed=i, max_tokens=40, ignore_eos=True) for i in range(6)]
    expected = [s.output_token_ids for s in big.engine.run([(f"r{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params))])]
    small = LLM(str(qwen3_tiny), prefix_cache=False, kv_blocks=12)
    got = small.engine.run([(f"r{i}", p, q) for i, (p, q) in enumerate(zip(prompts, params))])
    assert small.engine.scheduler.num_preemptions > 0
    assert [s.output_token_ids for s in got] == expected
    assert small.parts.cache.usage().used == 0


def test_mlx_backend_masks_the_same_way(qwen3_tiny):
    structured = StructuredOutput.json_schema(SCHEMAS["enums"])
    params = SamplingParams(max_tokens=24, structured=structured)
    prompt = [9707, 11, 1879, 0]
    torch_out = LLM(str(qwen3_tiny)).generate([prompt], params)[0]
    mlx_out = LLM(str(qwen3_tiny), backend="mlx").generate([prompt], params)[0]
    assert mlx_out.token_ids == torch_out.token_ids
    jsonschema.validate(json.loads(mlx_out.text), SCHEMAS["enums"])
