"""The decoder on MLX, built from an architecture's description (qwen_serve.models): same
weights, names and maths as the torch backend; the layer kinds live in decoder_layer.py."""
from __future__ import annotations

from typing import Callable

import numpy as np

from qwen_serve.errors import ModelLoadError
from qwen_serve.models.built_layer import skipped_expert_bytes
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.weights import EMBEDDING, FINAL_NORM, LM_HEAD, TensorsByName, layer_prefix
from qwen_serve.protocols import KVCache, SlidingWindow, StepBatch

from .attention import CachedAttention
from .decoder_layer import LayerWeights, build_layer
from .linear import DenseLinear, Linear
from .mx import mx
from .step_layout import build_layout


class DecoderModel:
    def __init__(self, config: ModelConfig, weights: dict[str, mx.array],
                 make_linear: Callable[..., Linear] = DenseLinear) -> None:
        self.config = config
        c = config
        if len(c.layers) != c.num_layers:
            raise ModelLoadError(f"{c.architecture}: no layer description to build {c.num_layers} layers from")
        tensors = TensorsByName(weights)
        self.layers = [build_layer(description, LayerWeights(tensors, layer_prefix(i), make_linear))
                       for i, description in enumerate(c.layers)]
        self.norm = tensors.take(FINAL_NORM).astype(mx.float32)
        # The embedding is a weight of the same shape as the head, built the same way (as int8
        # under quant "int4"): with tied embeddings the lookup and the head read one array.
        self.embedding = make_linear(tensors.take(EMBEDDING), None)
        head = tensors.take_if_present(LM_HEAD)
        if head is None and not c.tie_word_embeddings:
            raise ModelLoadError(f"checkpoint lacks {LM_HEAD} and does not tie embeddings")
        self.lm_head = self.embedding if head is None else make_linear(head, None)
        tensors.check_all_taken()
        self.attention = CachedAttention(scale=c.head_dim ** -0.5)
        # Materialize here: MLX cannot evaluate an array whose pending ops were recorded on
        # another thread, and the server's engine runs on its own.
        mx.eval(self._norms(), [vars(x) for x in self._linears()])

    def projections(self):
        """Calibratable.projections, layer by layer."""
        for layer in self.layers:
            yield from layer.projections()

    @staticmethod
    def to_numpy(x: mx.array):
        return np.array(x.astype(mx.float32))

    def weight_bytes(self) -> int:
        return sum(x.nbytes() for x in self._linears()) + sum(t.nbytes for t in self._norms())

    def active_weight_bytes(self) -> int:
        """ReadsRoutedExperts: what one decoded token reads."""
        return self.weight_bytes() - skipped_expert_bytes(self.layers)

    def _linears(self) -> list[Linear]:
        every = [self.embedding, self.lm_head] + [linear for layer in self.layers for linear in layer.linears()]
        return list({id(x): x for x in every}.values())  # a tied head counts once

    def _norms(self) -> list[mx.array]:
        return [self.norm] + [t for layer in self.layers for t in layer.norms()]

    def execute(self, batch: StepBatch, cache: KVCache) -> mx.array:
        sliding = cache if isinstance(cache, SlidingWindow) else None
        step = build_layout(batch, cache.block_size, cache.block_table, sliding)
        eps = self.config.rms_norm_eps
        hidden = self.embedding.rows(step.token_ids)
        for index, layer in enumerate(self.layers):
            x = mx.fast.rms_norm(hidden, layer.input_norm, eps)
            hidden = hidden + layer.mixer(index, x, cache, step, self.config, self.attention)
            hidden = hidden + layer.mlp(mx.fast.rms_norm(hidden, layer.post_norm, eps))
        last = mx.fast.rms_norm(hidden[step.sample_rows], self.norm, eps)
        logits = self.lm_head(last)
        mx.eval(logits)
        return logits
