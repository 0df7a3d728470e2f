"""Qwen3-Reranker's prompt and score, as its model card gives them: the query, the document and
an instruction go into a fixed chat turn whose answer is "yes" or "no", and the relevance score
is the probability of "yes" against "no" at the answer's first position."""
from __future__ import annotations

import math
from typing import Sequence

from ..checkpoints.tokenizer import Tokenizer
from ..errors import ModelLoadError

DEFAULT_INSTRUCTION = "Given a web search query, retrieve relevant passages that answer the query"
_JUDGE = ('Judge whether the Document meets the requirements based on the Query and the Instruct provided. '
          'Note that the answer can only be "yes" or "no".')
PREFIX = f"<|im_start|>system\n{_JUDGE}<|im_end|>\n<|im_start|>user\n"
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


def verdict_token_ids(tokenizer: Tokenizer) -> tuple[int, int]:
    """The ids of "no" and "yes", in the order ``relevance`` reads them."""
    ids = []
    for word in ("no", "yes"):
        token = tokenizer.token_to_id(word)
        if token is None:
            raise ModelLoadError(f"--task rerank needs {word!r} as one token of the vocabulary (as Qwen3-Reranker's)")
        ids.append(token)
    return ids[0], ids[1]


class RerankPrompt:
    """Token ids of one (query, document) pair: the prefix, the pair and the suffix tokenized
    apart and joined, as the model card's code does (tokenized whole, the seams could merge)."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.prefix = tokenizer.encode(PREFIX, add_special_tokens=False)
        self.suffix = tokenizer.encode(SUFFIX, add_special_tokens=False)

    def tokens(self, query: str, document: str, instruction: str | None = None) -> list[int]:
        pair = f"<Instruct>: {instruction or DEFAULT_INSTRUCTION}\n<Query>: {query}\n<Document>: {document}"
        return self.prefix + self.tokenizer.encode(pair, add_special_tokens=False) + self.suffix


def relevance(no_yes_logits: Sequence[float]) -> float:
    """P(yes) of the softmax over the two verdicts' logits (a sigmoid of their difference)."""
    no, yes = (float(x) for x in no_yes_logits)
    return 1.0 / (1.0 + math.exp(no - yes))
