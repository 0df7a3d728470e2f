"""The decoder on MLX, built from an architecture's description (qwen_serve.models): same
weights, names and maths as the torch backend; the layer kinds live in decoder_layer.py."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from qwen_serve.errors import ModelLoadError
from qwen_serve.models.built_layer import skipped_expert_bytes
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.weights import EMBEDDING, FINAL_NORM, TensorsByName, language_model_head, layer_prefix
from qwen_serve.protocols import KVCache, RecurrentState, SlidingWindow, StepBatch

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
        if c.draft_layers:
            raise ModelLoadError("the mlx backend does not run a multi-token-prediction head (--speculative mtp); "
                                 "the torch backend does")
        tensors = TensorsByName(weights)
        self.layers = [build_layer(description, LayerWeights(tensors, layer_prefix(i), make_linear, c.norm_offset))
                       for i, description in enumerate(c.layers)]
        self.norm = tensors.take(FINAL_NORM).astype(mx.float32) + c.norm_offset
        # The embedding is a weight of the same shape as the head, built the same way (as int8
        # under quant "int4"): with tied embeddings the lookup and the head read one array.
        self.embedding = make_linear(tensors.take(EMBEDDING), None)
        self.lm_head = language_model_head(c, tensors, self.embedding, make_linear)
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
        return list({id(x): x for x in every if x is not None}.values())  # a tied head counts once

    def _norms(self) -> list[mx.array]:
        return [self.norm] + [t for layer in self.layers for t in layer.norms()]

    def execute(self, batch: StepBatch, cache: KVCache) -> mx.array:
        logits = self.lm_head(self._final_hidden(batch, cache))
        mx.eval(logits)
        return logits

    def pool(self, batch: StepBatch, cache: KVCache, logit_ids: Sequence[int] | None) -> np.ndarray:
        """Pools: the final hidden rows, or the head's logits of logit_ids only."""
        hidden = self._final_hidden(batch, cache)
        rows = hidden if logit_ids is None else self.lm_head(hidden)[:, mx.array(list(logit_ids))]
        return self.to_numpy(rows)

    def _final_hidden(self, batch: StepBatch, cache: KVCache) -> mx.array:
        """The final norm's output at the sampled positions."""
        sliding = cache if isinstance(cache, SlidingWindow) else None
        recurrent = cache if isinstance(cache, RecurrentState) else None
        step = build_layout(batch, cache.block_size, cache.block_table, sliding, recurrent)
        eps = self.config.rms_norm_eps
        hidden = self.embedding.rows(step.token_ids)
        # each mixer addresses its own kind's layers: KV for attention, states for linear attention
        for index, layer in zip(self.config.mixer_indices(), self.layers):
            x = mx.fast.rms_norm(hidden, layer.input_norm, eps)
            hidden = hidden + layer.mixer(index, x, cache, step, self.config, self.attention)
            hidden = hidden + layer.mlp(mx.fast.rms_norm(hidden, layer.post_norm, eps))
        return mx.fast.rms_norm(hidden[step.sample_rows], self.norm, eps)
