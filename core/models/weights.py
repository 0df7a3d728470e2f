"""Weight names shared by every architecture here (transformers' names for the Llama family):
the vocabulary tables, the final norm, and where each decoder layer's weights sit."""
from __future__ import annotations

from typing import Any, Iterator

from ..errors import ModelLoadError
from .config import ModelConfig

EMBEDDING = "model.embed_tokens.weight"
LM_HEAD = "lm_head.weight"
FINAL_NORM = "model.norm.weight"
TABLE_NAMES = (EMBEDDING, LM_HEAD)  # the vocabulary-sized matrices


def layer_prefix(index: int) -> str:
    return f"model.layers.{index}"


def projection_names(config: ModelConfig) -> Iterator[tuple[int, str, str, str]]:
    """(layer index, kind prefix, projection, weight name) for every projection of the model,
    e.g. (3, "mlp", "up_proj", "model.layers.3.mlp.up_proj.weight")."""
    for index, layer in enumerate(config.layers):
        for kind, projection in layer.projections():
            yield index, kind.prefix, projection, f"{layer_prefix(index)}.{kind.prefix}.{projection}.weight"



class TensorsByName:
    """A checkpoint's tensors as a backend builds layers from them: each taken once by name, a
    missing one and any left untaken a ModelLoadError naming them (a wrong architecture shows up
    here, not as a shape error mid-forward)."""

    def __init__(self, tensors: dict[str, Any]) -> None:
        self._tensors = tensors

    def take(self, name: str) -> Any:
        try:
            return self._tensors.pop(name)
        except KeyError:
            raise ModelLoadError(f"checkpoint lacks tensor {name!r}") from None

    def take_if_present(self, name: str) -> Any | None:
        return self._tensors.pop(name, None)

    def check_all_taken(self) -> None:
        if self._tensors:
            raise ModelLoadError(f"checkpoint has unexpected tensors, e.g. {sorted(self._tensors)[:3]}")
