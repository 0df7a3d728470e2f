"""Per-request arguments for plugins (SamplingParams.extra_args, HTTP vllm_xargs), shown with the
example plugin examples/no-repeat-ngram: only the requests that name its argument feel it, the
plugin checks the values, and a name no plugin takes is refused. The example is loaded as a
plugin under development (QWEN_SERVE_PLUGIN_MODULES, its folder on the path), so these tests run
whether or not it is installed."""
from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import openai
import pytest
import torch
from server_fixtures import openai_client, own_server
from transformers import NoRepeatNGramLogitsProcessor

from qwen_serve import LLM, SamplingParams
from qwen_serve.conformance.models import Qwen3Geometry, make_qwen3_checkpoint
from qwen_serve.conformance.reference import hf_model
from qwen_serve.errors import InvalidRequest
from qwen_serve.logits.pipeline import LogitsPipeline

EXAMPLE = Path(__file__).parents[1] / "examples" / "no-repeat-ngram"
PLUGIN_ENV = {"QWEN_SERVE_PLUGINS": "", "QWEN_SERVE_PLUGIN_MODULES": "qwen_serve_no_repeat_ngram"}
WITHOUT_PLUGINS = {"QWEN_SERVE_PLUGINS": ""}
PROMPT = [5, 9, 13, 2, 40, 7]  # token ids: the model's vocabulary is 64 tokens
GREEDY = SamplingParams(max_tokens=48, ignore_eos=True)


def no_repeat(size) -> SamplingParams:
    return replace(GREEDY, extra_args={"no_repeat_ngram_size": size})


def repeated_ngrams(tokens: list[int], size: int) -> set[tuple[int, ...]]:
    grams = [tuple(tokens[i:i + size]) for i in range(len(tokens) - size + 1)]
    return {g for g in grams if grams.count(g) > 1}


@pytest.fixture(scope="module")
def example_on_path():
    with pytest.MonkeyPatch.context() as patch:
        patch.syspath_prepend(str(EXAMPLE))
        yield


@pytest.fixture(scope="module")
def vocab64(tmp_path_factory) -> Path:
    """A random model with 64 tokens, whose greedy output soon repeats itself."""
    return make_qwen3_checkpoint(tmp_path_factory.mktemp("qwen3-vocab64"), Qwen3Geometry(vocab_size=64), seed=4)


@pytest.fixture(scope="module")
def llm(vocab64, example_on_path):
    return LLM(str(vocab64), env=PLUGIN_ENV)


@pytest.fixture(scope="module")
def plain(vocab64):
    return LLM(str(vocab64), env=WITHOUT_PLUGINS)


def test_the_argument_bans_repeats_for_its_request_only(llm, plain):
    free = plain.generate([PROMPT], GREEDY)[0].token_ids
    assert repeated_ngrams(free, 2), "the test needs a greedy output that repeats a bigram"
    steered, untouched = llm.generate([PROMPT, PROMPT], [no_repeat(2), GREEDY])
    assert not repeated_ngrams(PROMPT + steered.token_ids, 2) and len(steered.token_ids) == 48
    assert untouched.token_ids == free  # same batch, no argument: as if the plugin were not loaded


def test_mlx_applies_the_same_ban(llm, vocab64):
    pytest.importorskip("mlx.core")
    mlx = LLM(str(vocab64), backend="mlx", env=PLUGIN_ENV)
    steered = mlx.generate([PROMPT], no_repeat(2))[0].token_ids
    assert steered == llm.generate([PROMPT], no_repeat(2))[0].token_ids


@pytest.mark.parametrize("size", [1, 3])
def test_greedy_with_the_argument_matches_transformers_processor(llm, vocab64, size):
    ours = llm.generate([PROMPT], replace(no_repeat(size), max_tokens=24))[0].token_ids
    model, ban = hf_model(vocab64), NoRepeatNGramLogitsProcessor(size)
    ids = torch.tensor([PROMPT])
    with torch.inference_mode():
        for _ in range(24):
            scores = ban(ids, model(input_ids=ids).logits[:, -1])
            ids = torch.cat([ids, scores.argmax(-1, keepdim=True)], dim=1)
    assert ours == ids[0, len(PROMPT):].tolist()


def test_a_name_no_plugin_takes_is_refused(llm, plain):
    for engine in (llm, plain):
        with pytest.raises(InvalidRequest) as exc:
            engine.generate([PROMPT], replace(GREEDY, extra_args={"no_repeat_ngram": 2}))
        assert exc.value.param == "vllm_xargs" and "'no_repeat_ngram'" in str(exc.value)
    assert "take: no_repeat_ngram_size" in str(_refusal(llm, {"typo": 1}))
    assert "take: none" in str(_refusal(plain, {"no_repeat_ngram_size": 2}))


@pytest.mark.parametrize("size", [0, -1, "x", 1.5, True, None, [2]])
def test_the_plugin_checks_its_own_values(llm, size):
    exc = _refusal(llm, {"no_repeat_ngram_size": size})
    assert exc.param == "vllm_xargs" and "'no_repeat_ngram_size' must be an integer >= 1" in str(exc)


def _refusal(llm: LLM, args: dict) -> InvalidRequest:
    with pytest.raises(InvalidRequest) as exc:
        llm.engine.check_request([1, 2, 3], replace(GREEDY, extra_args=args))
    return exc.value


@pytest.mark.parametrize("args", [{"k": {1, 2}}, {"k": float("nan")}, {"k": {1: "a"}}, {"": 1}, {3: 1}, [("k", 1)]])
def test_only_json_values_under_string_names(args):
    with pytest.raises(InvalidRequest) as exc:
        SamplingParams(extra_args=args)
    assert exc.value.param == "vllm_xargs"


def test_arguments_are_frozen_and_read_back_as_json():
    params = SamplingParams(extra_args={"b": [1, {"x": None}], "a": "s"})
    assert params.extra_arg_names == ("a", "b") and hash(params) == hash(replace(params))
    assert replace(params, max_tokens=3).extra_args == params.extra_args
    args = params.request_args(["b", "absent"])
    assert args == {"b": [1, {"x": None}]}
    args["b"].append(2)  # a copy: the request's own arguments stay as sent
    assert params.request_args(["b"]) == {"b": [1, {"x": None}]}


def test_two_processors_cannot_claim_one_name(example_on_path):
    from qwen_serve_no_repeat_ngram import NoRepeatNgram

    with pytest.raises(ValueError, match="'no_repeat_ngram_size' is claimed by two"):
        LogitsPipeline([NoRepeatNgram(), NoRepeatNgram()])


@pytest.fixture(scope="module")
def server(qwen3_tiny):
    """On the full-vocabulary tiny model: the server warms up on text, which a 64-token vocabulary lacks."""
    path = os.pathsep.join(filter(None, [str(EXAMPLE), os.environ.get("PYTHONPATH")]))
    yield from own_server(["--model", str(qwen3_tiny), "--kv-dtype", "float32"], env={**PLUGIN_ENV, "PYTHONPATH": path})


def test_vllm_xargs_over_http(server, qwen3_tiny, example_on_path):
    text = "the cat sat on the mat"  # greedy repeats a token of it within 48 tokens
    offline = LLM(str(qwen3_tiny), env=PLUGIN_ENV).generate([text, text], [no_repeat(1), GREEDY])
    assert offline[0].text != offline[1].text
    with openai_client(server) as client:
        model = client.models.list().data[0].id
        for args, want in (({"no_repeat_ngram_size": 1}, offline[0]), (None, offline[1])):
            reply = client.completions.create(model=model, prompt=text, max_tokens=48, temperature=0,
                                              extra_body={"ignore_eos": True, "vllm_xargs": args})
            assert reply.choices[0].text == want.text
        with pytest.raises(openai.BadRequestError) as exc:  # chat reads the field the same way
            client.chat.completions.create(model=model, messages=[{"role": "user", "content": "hi"}],
                                           extra_body={"vllm_xargs": [1]})
        assert exc.value.response.json()["error"]["param"] == "vllm_xargs"
        for args, words in (({"typo": 1}, "no loaded plugin takes 'typo'"),
                            ({"no_repeat_ngram_size": 0}, "must be an integer >= 1"), ([1], "valid dictionary")):
            with pytest.raises(openai.BadRequestError) as exc:
                client.completions.create(model=model, prompt=text, extra_body={"vllm_xargs": args})
            error = exc.value.response.json()["error"]
            assert error["param"] == "vllm_xargs" and words in error["message"]
            assert error["type"] == "invalid_request_error"
    status, _, body = server.request("GET", "/openapi.json")
    schemas = json.loads(body)["components"]["schemas"]
    assert all("vllm_xargs" in schemas[s]["properties"] for s in ("CompletionRequest", "ChatCompletionRequest"))
