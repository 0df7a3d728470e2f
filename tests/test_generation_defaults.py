"""The checkpoint's sampling defaults (generation_config.json) for the sampling fields a request
leaves out, on every API, as vLLM does: read and shown at start-up, the same tokens as sending
the values, a request's own values win, and --generation-config none gives the API's defaults."""
from __future__ import annotations

import json
import shutil

import pytest
from server_fixtures import own_server

from qwen_serve.checkpoints.checkpoint import load_checkpoint
from qwen_serve.openai.protocol import parse_chat_request
from qwen_serve.sampling.defaults import SamplingDefaults

QWEN3_THINKING = {"temperature": 0.6, "top_p": 0.95, "top_k": 20}  # what Qwen3's generation_config.json asks for
ASK = [{"role": "user", "content": "Write about the sea."}]


def test_read_from_generation_config():
    config = {"do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0,
              "repetition_penalty": "high", "max_new_tokens": 100, "eos_token_id": [1, 2]}
    defaults = SamplingDefaults.from_generation_config(config)
    assert defaults.as_dict() == {"temperature": 0.6, "top_p": 0.95, "top_k": 20, "min_p": 0.0}
    assert SamplingDefaults.from_generation_config({"top_k": 2.5, "temperature": float("nan")}) == SamplingDefaults()
    assert defaults.served("none") == SamplingDefaults() and defaults.served("auto") is defaults


def test_test_checkpoints_have_none(qwen3_tiny):
    """transformers' save_pretrained writes no sampling fields: the other tests stay greedy."""
    assert load_checkpoint(qwen3_tiny).config.sampling_defaults == SamplingDefaults()


def test_a_request_fills_only_what_it_leaves_out():
    defaults = SamplingDefaults.from_generation_config(QWEN3_THINKING)

    def params(**fields):
        body = json.dumps({"messages": ASK, **fields}).encode()
        return parse_chat_request(body, 1000, defaults).params

    omitted = params()
    assert (omitted.temperature, omitted.top_p, omitted.top_k) == (0.6, 0.95, 20)
    given = params(temperature=0, top_k=5)
    assert (given.temperature, given.top_p, given.top_k) == (0.0, 0.95, 5)
    assert params(temperature=None).temperature == 0.6  # null is omitted


@pytest.fixture(scope="module")
def qwen3_with_defaults(qwen3_tiny, tmp_path_factory):
    path = tmp_path_factory.mktemp("with-defaults") / "qwen3"
    shutil.copytree(qwen3_tiny, path)
    generation = json.loads((path / "generation_config.json").read_text())
    (path / "generation_config.json").write_text(json.dumps(generation | QWEN3_THINKING))
    return path


@pytest.fixture(scope="module", params=["auto", "none"])
def mode(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def server(mode, qwen3_with_defaults):
    yield from own_server(["--model", str(qwen3_with_defaults), "--generation-config", mode])


def completion(server, **fields) -> list[int]:
    status, _, body = server.request("POST", "/v1/completions", {"prompt": "The sea", "max_tokens": 12,
                                                                 "ignore_eos": True, "logprobs": 0, **fields})
    assert status == 200, body
    return json.loads(body)["choices"][0]["logprobs"]["tokens"]


def message_text(server, **fields) -> str:
    status, _, body = server.request("POST", "/v1/messages", {"model": "any", "max_tokens": 12, "messages": ASK,
                                                              **fields})
    assert status == 200, body
    return json.dumps(json.loads(body)["content"])


def response_text(server, **fields) -> str:
    status, _, body = server.request("POST", "/v1/responses", {"model": "any", "max_output_tokens": 12,
                                                               "input": "Write about the sea.", "store": False,
                                                               **fields})
    assert status == 200, body
    return json.dumps([item.get("content") for item in json.loads(body)["output"]])


def test_omitted_fields_sample_with_the_served_defaults(server, mode):
    auto = mode == "auto"
    expected = QWEN3_THINKING if auto else {"temperature": 0}
    shown = "temperature 0.6, top_p 0.95, top_k 20" if auto else "for fields a request leaves out: none"
    assert shown in server.output()
    for seed in (1, 2):
        assert completion(server, seed=seed) == completion(server, seed=seed, **expected)
    # random weights give flat distributions: sampled and greedy text part within 12 tokens
    sampled = [completion(server, seed=seed) for seed in (1, 2)]
    assert (sampled[0] != sampled[1]) is auto
    # Anthropic's and the Responses API have their own default (temperature 1) that the checkpoint's replaces
    anthropic_expected = QWEN3_THINKING if auto else {"temperature": 1.0, "top_p": 1.0, "top_k": 0}
    assert message_text(server, seed=3) == message_text(server, seed=3, **anthropic_expected)
    responses_expected = QWEN3_THINKING if auto else {"temperature": 1.0, "top_p": 1.0}
    assert response_text(server, seed=4) == response_text(server, seed=4, **responses_expected)
