"""Embeddings and reranking (--task embed / rerank) against transformers: an embedding is the
last token's final hidden state of transformers' bare decoder (Qwen3Model), L2-normalised; a
relevance score is the softmax of transformers' "no"/"yes" logits at the reranker prompt's last
position. Then the HTTP routes through the real openai client and raw requests: their shapes,
their 400s, and that no KV block is left behind."""
from __future__ import annotations

import base64
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from server_fixtures import openai_client, own_server

from qwen_serve.conformance.models import Qwen3Geometry, make_qwen3_embedding_checkpoint
from qwen_serve.engine.llm import LLM
from qwen_serve.errors import InvalidRequest, ModelLoadError
from qwen_serve.pooling.reranker import RerankPrompt

GEOMETRY = Qwen3Geometry(tie_word_embeddings=False)  # Qwen3-Embedding-4B and 8B: no head at all
TEXTS = ["Instruct: Given a web search query, retrieve relevant passages\nQuery:what is a cat",
         "Cats are small, carnivorous mammals kept as pets. " * 6, "x"]
QUERY = "what do cats eat"
DOCUMENTS = ["Cats eat meat: they are obligate carnivores.", "The stock market fell on Tuesday.", "Fish."]


@pytest.fixture(scope="module")
def embedding_model(tmp_path_factory) -> Path:
    return make_qwen3_embedding_checkpoint(tmp_path_factory.mktemp("qwen3-embedding"), GEOMETRY, seed=5)


def reference_embeddings(model: Path, token_lists: list[list[int]]) -> list[np.ndarray]:
    from transformers import AutoModel

    decoder = AutoModel.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        rows = [decoder(torch.tensor([tokens])).last_hidden_state[0, -1].numpy() for tokens in token_lists]
    return [row / np.linalg.norm(row) for row in rows]


def reference_relevance(model: Path, token_lists: list[list[int]], no_yes: tuple[int, int]) -> list[float]:
    from transformers import AutoModelForCausalLM

    lm = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32).eval()
    with torch.no_grad():
        return [torch.softmax(lm(torch.tensor([tokens])).logits[0, -1, list(no_yes)], 0)[1].item()
                for tokens in token_lists]


def cosine(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.dot(a, b) / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_embeddings_equal_transformers_last_token_alone_and_batched(embedding_model, backend):
    """The checkpoint says Qwen3ForCausalLM but is laid out as Qwen3-Embedding (bare names, no
    head, sentence-transformers' last-token pooling): auto picks embed and builds no head. A
    chunk size of 16 splits the long input over several prefill steps."""
    llm = LLM(str(embedding_model), backend=backend, chunk_size=16, kv_dtype="float32")
    assert llm.parts.engine_config.task == "embed" and not llm.config.head
    token_lists = [llm.tokenizer.encode(t) for t in TEXTS]
    expected = reference_embeddings(embedding_model, token_lists)
    batched = llm.embed(TEXTS)
    alone = [llm.embed(t)[0] for t in TEXTS]
    for got_batched, got_alone, want in zip(batched, alone, expected):
        assert cosine(got_batched, want) >= 0.9999 and cosine(got_alone, want) >= 0.9999
        assert abs(np.linalg.norm(got_batched) - 1) < 1e-5
    assert llm.parts.cache.usage().used == llm.parts.cache.usage().cached  # only prefix-cached blocks stay


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_rerank_scores_equal_the_softmax_of_transformers_yes_no_logits(qwen3_tiny, backend):
    llm = LLM(str(qwen3_tiny), backend=backend, task="rerank", kv_dtype="float32")
    prompt = RerankPrompt(llm.tokenizer)
    token_lists = [prompt.tokens(QUERY, d) for d in DOCUMENTS]
    no_yes = (llm.tokenizer.token_to_id("no"), llm.tokenizer.token_to_id("yes"))
    expected = reference_relevance(qwen3_tiny, token_lists, no_yes)
    assert llm.score(QUERY, DOCUMENTS) == pytest.approx(expected, abs=1e-4)
    assert len(set(np.round(expected, 3))) == len(DOCUMENTS)  # the documents really score apart


def test_the_task_must_suit_the_checkpoint(embedding_model, qwen3_tiny, tmp_path):
    with pytest.raises(ModelLoadError, match="--task embed"):
        LLM(str(embedding_model), task="generate")
    mean_pooled = tmp_path / "mean"
    mean_pooled.mkdir()
    for item in embedding_model.iterdir():
        if item.is_file():
            (mean_pooled / item.name).write_bytes(item.read_bytes())
    (mean_pooled / "1_Pooling").mkdir()
    (mean_pooled / "1_Pooling" / "config.json").write_text(json.dumps({"pooling_mode_mean_tokens": True}))
    with pytest.raises(ModelLoadError, match="only last-token"):
        LLM(str(mean_pooled))
    generating = LLM(str(qwen3_tiny), task="auto")
    assert generating.parts.engine_config.task == "generate"
    with pytest.raises(InvalidRequest, match="--task embed or --task rerank"):
        generating.embed("hello")


def test_dimensions_need_a_model_trained_for_them(embedding_model, tmp_path):
    llm = LLM(str(embedding_model), kv_dtype="float32")
    full = llm.embed("hello")[0]
    cut = llm.embed("hello", dimensions=16)[0]
    assert cut.shape == (16,) and cosine(cut, full[:16]) > 0.99999 and abs(np.linalg.norm(cut) - 1) < 1e-5
    with pytest.raises(InvalidRequest, match="not a width"):
        llm.embed("hello", dimensions=GEOMETRY.hidden_size + 1)
    plain = make_qwen3_embedding_checkpoint(tmp_path / "plain", GEOMETRY, seed=5, matryoshka=False)
    with pytest.raises(InvalidRequest, match="not trained for shortened"):
        LLM(str(plain)).embed("hello", dimensions=16)


# --- over HTTP ------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def embed_server(embedding_model):
    yield from own_server(["--model", str(embedding_model), "--kv-dtype", "float32", "--chunk-size", "16",
                           "--served-model-name", "embedder"])


@pytest.fixture(scope="module")
def rerank_server(qwen3_tiny):
    yield from own_server(["--model", str(qwen3_tiny), "--task", "rerank", "--kv-dtype", "float32",
                           "--served-model-name", "reranker"])


def post(server, path: str, body: dict) -> tuple[int, dict]:
    status, _, raw = server.request("POST", path, body)
    return status, json.loads(raw)


def test_openai_client_embeddings_as_floats_and_base64(embed_server, embedding_model):
    with openai_client(embed_server) as client:
        as_floats = client.embeddings.create(model="embedder", input=TEXTS, encoding_format="float")
        as_base64 = client.embeddings.create(model="embedder", input=TEXTS)  # the client asks for base64
        by_ids = client.embeddings.create(model="embedder", input=[[9707, 1879]], encoding_format="float")
    status, raw_base64 = post(embed_server, "/v1/embeddings", {"input": TEXTS, "encoding_format": "base64"})
    assert status == 200 and isinstance(raw_base64["data"][0]["embedding"], str)
    from qwen_serve.checkpoints.hf import load_hf_tokenizer

    tokenizer = load_hf_tokenizer(embedding_model)
    token_lists = [tokenizer.encode(t) for t in TEXTS]
    expected = reference_embeddings(embedding_model, token_lists + [[9707, 1879]])
    assert [d.index for d in as_floats.data] == [0, 1, 2]
    assert as_floats.usage.prompt_tokens == sum(map(len, token_lists)) == as_floats.usage.total_tokens
    for floats, packed, raw, want in zip(as_floats.data, as_base64.data, raw_base64["data"], expected):
        decoded = np.frombuffer(base64.b64decode(raw["embedding"]), dtype="<f4")
        assert cosine(np.array(floats.embedding), want) >= 0.9999
        assert np.allclose(packed.embedding, floats.embedding, atol=1e-6) and np.allclose(decoded, floats.embedding)
    assert cosine(np.array(by_ids.data[0].embedding), expected[-1]) >= 0.9999


def test_embedding_requests_refused_with_a_400_leave_nothing_behind(embed_server):
    too_long = " word" * 5000
    for body, param in [({"input": ""}, "input"), ({"input": []}, "input"), ({"input": too_long}, None),
                        ({"input": "hi", "dimensions": GEOMETRY.hidden_size + 1}, "dimensions"),
                        ({"input": "hi", "encoding_format": "int8"}, "encoding_format"),
                        ({"input": ["fine", too_long]}, None)]:
        status, reply = post(embed_server, "/v1/embeddings", body)
        assert status == 400 and reply["error"]["param"] == param, (body if len(str(body)) < 99 else param, reply)
    status, reply = post(embed_server, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and "--task embed" in reply["error"]["message"]
    status, reply = post(embed_server, "/v1/messages", {"model": "x", "max_tokens": 4,
                                                         "messages": [{"role": "user", "content": "hi"}]})
    assert status == 400 and reply["type"] == "error" and "--task embed" in reply["error"]["message"]
    status, reply = post(embed_server, "/v1/rerank", {"query": "a", "documents": ["b"]})
    assert status == 400 and "--task rerank" in reply["error"]["message"]
    m = embed_server.wait_until_idle(timeout_s=30)
    assert m["kv_blocks_used"] == m["kv_blocks_cached"] and m["requests_active"] == 0


def test_rerank_and_score_routes(rerank_server, qwen3_tiny):
    status, reply = post(rerank_server, "/v1/rerank", {"model": "reranker", "query": QUERY, "documents": DOCUMENTS})
    assert status == 200, reply
    from qwen_serve.checkpoints.hf import load_hf_tokenizer

    tokenizer = load_hf_tokenizer(qwen3_tiny)
    prompt = RerankPrompt(tokenizer)
    token_lists = [prompt.tokens(QUERY, d) for d in DOCUMENTS]
    expected = reference_relevance(qwen3_tiny, token_lists, (tokenizer.token_to_id("no"), tokenizer.token_to_id("yes")))
    order = sorted(range(len(DOCUMENTS)), key=lambda i: -expected[i])
    assert [r["index"] for r in reply["results"]] == order
    assert [r["relevance_score"] for r in reply["results"]] == pytest.approx([expected[i] for i in order], abs=1e-4)
    assert [r["document"]["text"] for r in reply["results"]] == [DOCUMENTS[i] for i in order]
    assert reply["usage"]["total_tokens"] == sum(map(len, token_lists))

    status, top = post(rerank_server, "/v1/rerank", {"query": QUERY, "documents": [{"text": d} for d in DOCUMENTS],
                                                     "top_n": 1, "return_documents": False})
    assert status == 200 and [r["index"] for r in top["results"]] == order[:1] and "document" not in top["results"][0]

    status, scores = post(rerank_server, "/v1/score", {"text_1": QUERY, "text_2": DOCUMENTS})
    assert status == 200 and [d["index"] for d in scores["data"]] == [0, 1, 2]
    assert [d["score"] for d in scores["data"]] == pytest.approx(expected, abs=1e-4)
    status, pairs = post(rerank_server, "/v1/score", {"text_1": [QUERY] * 3, "text_2": DOCUMENTS})
    assert status == 200 and [d["score"] for d in pairs["data"]] == pytest.approx(expected, abs=1e-4)

    for path, body in [("/v1/score", {"text_1": ["a", "b"], "text_2": ["c", "d", "e"]}),
                       ("/v1/rerank", {"query": QUERY, "documents": []}),
                       ("/v1/rerank", {"query": "", "documents": ["a"]}),
                       ("/v1/embeddings", {"input": "hi"}),
                       ("/v1/completions", {"prompt": "hi"})]:
        status, reply = post(rerank_server, path, body)
        assert status == 400 and reply["error"]["message"], (path, reply)
    m = rerank_server.wait_until_idle(timeout_s=30)
    assert m["kv_blocks_used"] == m["kv_blocks_cached"] and m["requests_active"] == 0


def test_generating_server_refuses_pooling_routes(overload_server):
    status, reply = post(overload_server, "/v1/embeddings", {"input": "hi"})
    assert status == 400 and "--task embed" in reply["error"]["message"]


@pytest.mark.parametrize("task", ["embed", "rerank"])
def test_the_pooling_routes_hold_their_documented_contract(task, request):
    """test_server_fuzz.py's check on the routes a pooling server serves (a generating server
    answers them with 400s only): valid requests from the schema get 200s matching the documented
    body, invalid ones 400s, never a 5xx; afterwards no KV block is left."""
    import schemathesis
    from hypothesis import HealthCheck, given, settings
    from schema_checks import call_and_check
    from schemathesis import GenerationMode

    server = request.getfixturevalue(f"{task}_server")
    paths = ("/v1/embeddings",) if task == "embed" else ("/v1/rerank", "/v1/score")
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    document = json.loads(server.request("GET", "/openapi.json")[2])
    statuses: dict[tuple[str, str], set[int]] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        if operation.path not in paths:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            negative = mode is GenerationMode.NEGATIVE

            @given(case=operation.as_strategy(mode))
            @settings(max_examples=25, deadline=None, database=None, derandomize=True,
                      suppress_health_check=list(HealthCheck))
            def holds(case):
                status = call_and_check(case, document, negative)
                statuses.setdefault((case.path, "negative" if negative else "positive"), set()).add(status)

            holds()
    for path in paths:
        assert 200 in statuses[path, "positive"] and 400 in statuses[path, "negative"], statuses
    m = server.wait_until_idle(timeout_s=30)
    assert m["kv_blocks_used"] == m["kv_blocks_cached"] and m["requests_active"] == 0
