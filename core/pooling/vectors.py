"""Embedding vectors as an API returns them: cut to a Matryoshka width, L2-normalised, and as
floats or base64."""
from __future__ import annotations

import base64

import numpy as np

from ..errors import InvalidRequest
from ..models.config import ModelConfig


def normalized(row: np.ndarray, dimensions: int | None = None) -> np.ndarray:
    """The first ``dimensions`` values (all without it) scaled to unit length: the normalised
    embedding of a model trained to be cut there."""
    vector = np.asarray(row, dtype=np.float64)[:dimensions]
    norm = np.linalg.norm(vector)
    return (vector / norm if norm > 0 else vector).astype(np.float32)


def encoded(vector: np.ndarray, encoding_format: str) -> list[float] | str:
    """``float``: a JSON list; ``base64``: the little-endian float32 bytes (as OpenAI's)."""
    if encoding_format == "base64":
        return base64.b64encode(vector.astype("<f4").tobytes()).decode("ascii")
    return vector.tolist()


def checked_dimensions(dimensions: int | None, model_config: ModelConfig) -> int | None:
    """``dimensions`` if the model was trained to be cut there (Matryoshka), else a 400."""
    if dimensions is None:
        return None
    allowed = model_config.matryoshka_dimensions
    if allowed is None:
        raise InvalidRequest("this model was not trained for shortened embeddings (its config.json sets neither "
                             "is_matryoshka nor matryoshka_dimensions)", param="dimensions")
    if dimensions > model_config.hidden_size or (allowed and dimensions not in allowed):
        widths = ", ".join(map(str, allowed)) if allowed else f"1 to {model_config.hidden_size}"
        raise InvalidRequest(f"{dimensions} is not a width this model was trained for ({widths})", param="dimensions")
    return dimensions
