"""A compute backend: its executor (weights, one batched forward), sampler and KV storage,
and the optional abilities a backend may bring (quantized linears, a KV dtype choice, kernel
choice by measurement, calibration)."""
from __future__ import annotations

from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

from ..models.config import ModelConfig
from ..sampling.adjustment import BatchAdjustment
from ..sampling.params import SamplingParams
from .batch import SampleResult, StepBatch
from .kv import KVCache, KVStorage


@runtime_checkable
class QuantizedLinear(Protocol):
    """y = x @ W.T for a weight stored in a compressed format."""

    in_features: int
    out_features: int

    def __call__(self, x: Any) -> Any: ...

    def dequantize(self) -> Any: ...

    def nbytes(self) -> int: ...


@runtime_checkable
class Sampler(Protocol):
    """Turns logits into tokens; each request draws from its own generator, seeded once.

    ``adjustment`` (only passed when some row has one) holds the logits processors' changes as
    numpy arrays; the sampler applies them first (penalties, biases, masks), greedy rows
    included, then temperature, top-k, softmax, top-p, min-p and the draw. Log-probabilities stay
    the model's own, before any of that. The built-in backends share one implementation of this
    rule (``sampling.numpy_sampler.NumpySampler`` over ``sampling.rule``); a backend may bring its own.
    """

    def make_generator(self, seed: int) -> Any: ...

    def sample(
        self, logits: Any, params: Sequence[SamplingParams], generators: Sequence[Any],
        adjustment: BatchAdjustment | None = None,
    ) -> SampleResult: ...


@runtime_checkable
class ModelExecutor(Protocol):
    """Owns the weights; runs one batched forward over a StepBatch."""

    config: ModelConfig

    def weight_bytes(self) -> int: ...

    def execute(self, batch: StepBatch, cache: KVCache) -> Any:
        """Logits [sum of 1 + num_draft over chunks with sample=True, vocab], in chunk order (a
        chunk with drafts gives its last num_draft + 1 rows, in position order)."""


@runtime_checkable
class Pools(Protocol):
    """An executor that can serve hidden states instead of sampled text: embeddings (the final
    norm's output) and scores (a few chosen logits, e.g. a reranker's "no"/"yes"). A model
    config with ``head`` False is built without its language-model head and only pools hidden
    states."""

    def pool(self, batch: StepBatch, cache: KVCache, logit_ids: Sequence[int] | None) -> Any:
        """A float32 numpy array with a row per chunk with sample=True (its last position), in
        chunk order: the final norm's output [rows, hidden] when logit_ids is None, else the
        head's logits of those token ids [rows, len(logit_ids)]."""


@runtime_checkable
class ChoosesKVDtype(Protocol):
    """A backend that knows which KV storage dtype serves best on this machine; the server's
    default ``--kv-dtype auto`` follows it (other backends keep the weights' dtype)."""

    def preferred_kv_dtype(self, dtype: str) -> tuple[str, str]:
        """(the KV dtype for weights of ``dtype``, why, in a few words for the start-up plan)."""


@runtime_checkable
class ChoosesKernels(Protocol):
    """An executor that chose among compute paths by timing them on this CPU: the start-up plan
    and ``qwen-serve bench --kernels`` print the table it chose from."""

    def kernel_table(self) -> list[str]:
        """Lines of text: each shape's paths, their timings and the choice (none: nothing chosen)."""


@runtime_checkable
class ReadsRoutedExperts(Protocol):
    """An executor whose decode step reads only part of its weights (a mixture of experts: each
    token's routed experts, not all of them); the start-up plan prints both figures."""

    def active_weight_bytes(self) -> int:
        """The bytes one decoded token reads: every weight but the experts its router skips."""


@runtime_checkable
class Calibratable(Protocol):
    """An executor whose projections can be watched while it runs, so int4 quantization can
    weigh each input column by the activations it meets (qwen_serve.quant.calibration)."""

    def projections(self) -> Iterable[tuple[str, Any, str]]:
        """(checkpoint weight name, object holding the layer, attribute name) of every linear
        layer that int4 quantizes. Names may share one layer (projections merged into one
        matmul read the same input): each gets that layer's input statistics."""

    def to_numpy(self, x: Any) -> Any:
        """A layer input as a numpy array."""


@runtime_checkable
class Backend(Protocol):
    """A compute path: builds executors, KV storage and samplers for one array library."""

    name: str
    quantizations: tuple[str, ...]  # what load_model's quant accepts, e.g. ("none", "int4")
    # Optional: ``serial_compute`` (a reason string) when, on this machine, the backend multiplies
    # a batch of rows no faster than the rows one by one; the conformance suite reads it.

    def load_model(self, checkpoint: Any, dtype: str, quant: str) -> ModelExecutor:
        """A backend whose float executor is Calibratable also takes ``importance`` (checkpoint
        weight name -> per-input-column weights) and passes it to int4.quantize."""

    def create_kv_storage(
        self, config: ModelConfig, dtype: str, block_size: int, slab_blocks: int, max_blocks: int
    ) -> KVStorage: ...

    def create_sampler(self) -> Sampler: ...
