"""What a server does with its model: generate text, embed, or rerank (``--task``)."""
from __future__ import annotations

from ..config import TASKS
from ..errors import ModelLoadError
from ..models.config import ModelConfig


def resolve_task(requested: str, config: ModelConfig) -> str:
    """The task to serve: ``auto`` follows the checkpoint (an embedding model embeds, anything
    else generates; a reranker says Qwen3ForCausalLM like any chat model, so rerank is only
    ever asked for). ModelLoadError when the checkpoint cannot serve the task asked for."""
    if requested != "auto" and requested not in TASKS:
        raise ValueError(f"unknown task {requested!r}; one of auto, {', '.join(TASKS)}")
    task = ("embed" if config.pooling else "generate") if requested == "auto" else requested
    if task == "embed" and config.pooling not in (None, "last"):
        raise ModelLoadError(f"{config.name} pools its hidden states by {config.pooling!r}; only last-token "
                             "pooling (Qwen3-Embedding's) is served, and another would give wrong embeddings")
    if task != "embed" and config.pooling is not None:
        raise ModelLoadError(f"{config.name} is an embedding model (it pools the last token's hidden state): "
                             "serve it with --task embed")
    return task
