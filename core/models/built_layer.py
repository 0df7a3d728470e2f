"""A decoder layer as a backend builds it from its description: the two norms as arrays and each
kind as the backend's implementation of it. Shared by the backends because the walk is the same;
only the implementations differ."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Mapping

from ..errors import ModelLoadError
from .layers import DecoderLayer, SparseMoE


@dataclass
class BuiltLayer:
    input_norm: Any
    mixer: Any  # the backend's implementation of description.mixer
    post_norm: Any
    mlp: Any  # the backend's implementation of description.mlp

    @classmethod
    def build(cls, description: DecoderLayer, weights: Any, implemented: Mapping[type, type],
              backend: str) -> "BuiltLayer":
        """weights: the backend's view of this layer's tensors (a ``norm(name)`` method, and
        whatever its implementations take); implemented: layer kind -> implementation class."""
        norms = [weights.norm(name) for name in description.norms]
        mixer, mlp = (implementation(kind, implemented, backend)(kind, weights)
                      for kind in (description.mixer, description.mlp))
        return cls(norms[0], mixer, norms[1], mlp)

    def linears(self) -> list[Any]:
        return self.mixer.linears() + self.mlp.linears()

    def norms(self) -> list[Any]:
        return [self.input_norm, self.post_norm] + self.mixer.norms() + self.mlp.norms()

    def projections(self) -> Iterator[tuple[str, Any, str]]:
        """Calibratable.projections of this layer: (weight name, owner, attribute)."""
        yield from self.mixer.projections()
        yield from self.mlp.projections()


def implementation(kind: Any, implemented: Mapping[type, type], backend: str) -> type:
    if type(kind) not in implemented:
        raise ModelLoadError(f"the {backend} backend does not implement {type(kind).__name__} layers yet")
    return implemented[type(kind)]


def skipped_expert_bytes(layers: list[BuiltLayer]) -> int:
    """The weight bytes a decoded token does not read: in each mixture-of-experts layer, the
    share (num_experts - top_k) / num_experts of its routed experts (all of one layer's are one
    size; a shared expert runs on every token)."""
    skipped = 0
    for layer in layers:
        kind = getattr(layer.mlp, "kind", None)
        if isinstance(kind, SparseMoE):
            experts = sum(linear.nbytes() for expert in layer.mlp.experts for linear in expert.linears())
            skipped += experts * (kind.num_experts - kind.top_k) // kind.num_experts
    return skipped

