"""The request bodies of the pooling routes: OpenAI's /v1/embeddings, and the rerank (Jina's and
Cohere's shape, as vLLM and llama.cpp's server take it) and score (vLLM's) routes."""
from __future__ import annotations

from typing import Annotated, Literal, Union

from pydantic import Field, model_validator

from ..chat.validation import Body, integer, parse_json_object, validate
from ..errors import InvalidRequest
from .protocol import Prompt, Request

MAX_INPUTS = 2048  # texts in one request, as OpenAI's embeddings take at most (and Cohere's rerank 1,000)
Text = Annotated[str, Field(min_length=1)]
Texts = Annotated[list[Text], Field(min_length=1, max_length=MAX_INPUTS)]
INSTRUCTION = Field(None, description="the reranker's task instruction (Qwen3-Reranker's <Instruct>); omitted: "
                                      "\"Given a web search query, retrieve relevant passages that answer the query\"")


class EmbeddingRequest(Request):
    input: Prompt = Field(description="each text or token-id list is embedded apart (an empty one is a 400); "
                                      "texts are tokenized with the tokenizer's special tokens")
    encoding_format: Literal["float", "base64"] = Field("float", description="base64: little-endian float32")
    dimensions: integer(ge=1) | None = Field(None, description="only for a model trained for it (Matryoshka): "
                                                               "the first values, renormalized")

    @model_validator(mode="after")
    def _bounded(self) -> EmbeddingRequest:
        if len(self.input) > MAX_INPUTS:
            raise InvalidRequest(f"at most {MAX_INPUTS} inputs per request", param="input")
        return self


class Document(Body):
    text: Text


class RerankRequest(Request):
    query: Text
    documents: Annotated[list[Union[Text, Document]], Field(min_length=1, max_length=MAX_INPUTS)]
    top_n: integer(ge=1) | None = Field(None, description="the best this many; omitted: all, best first")
    return_documents: bool = True
    instruction: Text | None = INSTRUCTION

    @property
    def texts(self) -> list[str]:
        return [d.text if isinstance(d, Document) else d for d in self.documents]


class ScoreRequest(Request):
    """One query against each document (text_1 a string or one text), or pairs in order (lists
    of one length)."""

    text_1: Union[Text, Texts]
    text_2: Union[Text, Texts]
    instruction: Text | None = INSTRUCTION

    @property
    def pairs(self) -> list[tuple[str, str]]:
        queries = [self.text_1] if isinstance(self.text_1, str) else self.text_1
        documents = [self.text_2] if isinstance(self.text_2, str) else self.text_2
        if len(queries) == 1:
            return [(queries[0], document) for document in documents]
        return list(zip(queries, documents))

    @model_validator(mode="after")
    def _paired(self) -> ScoreRequest:
        queries = 1 if isinstance(self.text_1, str) else len(self.text_1)
        documents = 1 if isinstance(self.text_2, str) else len(self.text_2)
        if queries != 1 and queries != documents:
            raise InvalidRequest(f"text_1 has {queries} texts and text_2 {documents}: give one text_1, or as many "
                                 "as text_2", param="text_1")
        return self


def parse_embedding_request(raw: bytes, vocab_size: int) -> EmbeddingRequest:
    return validate(EmbeddingRequest, parse_json_object(raw), vocab_size=vocab_size)


def parse_rerank_request(raw: bytes) -> RerankRequest:
    return validate(RerankRequest, parse_json_object(raw))


def parse_score_request(raw: bytes) -> ScoreRequest:
    return validate(ScoreRequest, parse_json_object(raw))
