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


# linear attention's input projections (layers.GatedDeltaNet), named without the usual suffix
LINEAR_ATTENTION_PROJECTIONS = (".in_proj_qkv.weight", ".in_proj_z.weight")


def is_projection(name: str) -> bool:
    """A decoder layer's projection weight: what quant "int4" stores as int4 (the vocabulary
    tables have a choice of their own; norms, routers, biases and linear attention's per-head
    gates stay float)."""
    return name.endswith(("_proj.weight",) + LINEAR_ATTENTION_PROJECTIONS) and name not in TABLE_NAMES


def layer_prefix(index: int) -> str:
    return f"model.layers.{index}"


def projection_names(config: ModelConfig) -> Iterator[tuple[int, str, str, str]]:
    """(layer index, kind prefix, projection, weight name) for every projection of the model,
    e.g. (3, "mlp", "up_proj", "model.layers.3.mlp.up_proj.weight")."""
    for index, layer in enumerate(config.layers):
        for kind, projection in layer.projections():
            yield index, kind.prefix, projection, f"{layer_prefix(index)}.{kind.prefix}.{projection}.weight"



def language_model_head(config: ModelConfig, tensors: "TensorsByName", embedding: Any, make_linear: Any) -> Any:
    """The head a backend builds: ``lm_head`` (through make_linear), the embedding table itself
    when tied, or None for a model built without one (config.head False: an embedding model;
    a head its checkpoint has anyway is dropped unread)."""
    head = tensors.take_if_present(LM_HEAD)
    if not config.head:
        return None
    if head is None and not config.tie_word_embeddings:
        raise ModelLoadError(f"checkpoint lacks {LM_HEAD} and does not tie embeddings")
    return embedding if head is None else make_linear(head, None)


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

    def shape(self, name: str) -> tuple[int, ...]:
        """The shape of a tensor not yet taken: an array's, or (out, in) of a layer the backend
        already made from it (a quantized projection)."""
        tensor = self._tensors.get(name)
        if tensor is None:
            raise ModelLoadError(f"checkpoint lacks tensor {name!r}")
        return tuple(tensor.shape) if hasattr(tensor, "shape") else (tensor.out_features, tensor.in_features)

    def check_shapes(self, expected: dict[str, tuple[int, ...]]) -> None:
        """ModelLoadError naming the first tensor whose shape is not what the config says."""
        for name, shape in expected.items():
            if self.shape(name) != shape:
                raise ModelLoadError(f"tensor {name!r} has shape {list(self.shape(name))}; config.json says {list(shape)}")

    def take_router(self, layer_prefix: str, kind: Any) -> Any:
        """A mixture of experts' router, once every weight of the layer kind (``SparseMoE``) has
        the shape config.json gives it; the router's columns give the hidden size."""
        router = f"{layer_prefix}.{kind.prefix}.{kind.router}.weight"
        shapes = kind.shapes(self.shape(router)[-1])
        self.check_shapes({f"{layer_prefix}.{name}": shape for name, shape in shapes.items()})
        return self.take(router)

    def take_if_present(self, name: str) -> Any | None:
        return self._tensors.pop(name, None)

    def check_all_taken(self) -> None:
        if self._tensors:
            raise ModelLoadError(f"checkpoint has unexpected tensors, e.g. {sorted(self._tensors)[:3]}")
