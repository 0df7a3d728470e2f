"""The decoder on MLX, built from an architecture's description (qwen_serve.models): same
weights, names and maths as the torch backend; the layer kinds live in decoder_layer.py."""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np

from qwen_serve.errors import ModelLoadError
from qwen_serve.models.built_layer import skipped_expert_bytes
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.draft_head import greedy_drafts
from qwen_serve.models.weights import EMBEDDING, FINAL_NORM, TensorsByName, language_model_head, layer_prefix
from qwen_serve.protocols import DraftRequest, KVCache, RecurrentState, ScheduledChunk, SlidingWindow, StepBatch

from .attention import CachedAttention
from .decoder_layer import LayerWeights, build_layer, run_layer
from .draft_head import DraftHeadLayers
from .linear import DenseLinear, Linear
from .mx import mx
from .step_layout import StepLayout, build_layout


class DecoderModel:
    def __init__(self, config: ModelConfig, weights: dict[str, mx.array],
                 make_linear: Callable[..., Linear] = DenseLinear) -> None:
        self.config = config
        c = config
        if len(c.layers) != c.num_layers:
            raise ModelLoadError(f"{c.architecture}: no layer description to build {c.num_layers} layers from")
        tensors = TensorsByName(weights)
        self.layers = [build_layer(description, LayerWeights(tensors, layer_prefix(i), make_linear, c.norm_offset))
                       for i, description in enumerate(c.layers)]
        self.norm = tensors.take(FINAL_NORM).astype(mx.float32) + c.norm_offset
        self.draft_head = DraftHeadLayers.build(c, tensors, make_linear) if c.draft_layers else None
        self.mixer_indices = c.mixer_indices()  # each layer's KV layer or state layer
        self._last_step: tuple[StepBatch, mx.array] | None = None  # (batch, final hidden rows) for the head
        self.draft_ids: mx.array | None = None  # the tokens drafts are scored over (None: all)
        self.draft_scorer: Linear | None = None  # the head's rows of draft_ids (narrow_draft_vocabulary)
        # The embedding is a weight of the same shape as the head, built the same way (as int8
        # under quant "int4"): with tied embeddings the lookup and the head read one array.
        self.embedding = make_linear(tensors.take(EMBEDDING), None)
        self.lm_head = language_model_head(c, tensors, self.embedding, make_linear)
        tensors.check_all_taken()
        self.attention = CachedAttention(scale=c.head_dim ** -0.5)
        # Materialize here: MLX cannot evaluate an array whose pending ops were recorded on
        # another thread, and the server's engine runs on its own.
        mx.eval(self._norms(), [vars(x) for x in self._linears()])

    def built_layers(self) -> list:
        """The decoder layers, then the draft head's (if built)."""
        return self.layers + (self.draft_head.layers if self.draft_head is not None else [])

    def projections(self):
        """Calibratable.projections, layer by layer."""
        for layer in self.built_layers():
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
        every = [self.embedding, self.lm_head] + [linear for layer in self.built_layers() for linear in layer.linears()]
        every += self.draft_head.linears() if self.draft_head is not None else []
        every.append(self.draft_scorer)
        return list({id(x): x for x in every if x is not None}.values())  # a tied head counts once

    def _norms(self) -> list[mx.array]:
        norms = [self.norm] + [t for layer in self.built_layers() for t in layer.norms()]
        return norms + (self.draft_head.norms() if self.draft_head is not None else [])

    def execute(self, batch: StepBatch, cache: KVCache) -> mx.array:
        hidden, step = self._residual(batch, cache)
        eps = self.config.rms_norm_eps
        if self.draft_head is None:
            logits = self.lm_head(mx.fast.rms_norm(hidden[step.sample_rows], self.norm, eps))
            mx.eval(logits)
            return logits
        normed = mx.fast.rms_norm(hidden, self.norm, eps)  # the head continues from every row
        self._last_step = (batch, normed[step.in_chunk_order])
        logits = self.lm_head(normed[step.sample_rows])
        mx.eval(logits, self._last_step[1])
        return logits

    def draft(self, requests: Sequence[DraftRequest], cache: KVCache) -> list[list[int]]:
        """DraftHead: greedy rounds of the head (qwen_serve.models.draft_head) from the last step."""
        batch, hidden = self._last_step
        return greedy_drafts(requests, batch.chunks, hidden, lambda spans, rows: self._draft_pass(spans, rows, cache),
                             lambda x, rows: x[mx.array(rows, dtype=mx.int32)],
                             self._draft_guesses)

    def _draft_guesses(self, out: mx.array) -> list[int]:
        if self.draft_scorer is None:
            return mx.argmax(self.lm_head(out), axis=-1).tolist()
        return self.draft_ids[mx.argmax(self.draft_scorer(out), axis=-1)].tolist()

    def narrow_draft_vocabulary(self, token_ids: Sequence[int] | None) -> None:
        """NarrowsDraftVocabulary: the head's rows of token_ids score drafts."""
        if token_ids is None:
            self.draft_ids = self.draft_scorer = None
            return
        self.draft_ids = mx.array(list(token_ids), dtype=mx.int32)
        self.draft_scorer = self.lm_head.with_rows(self.draft_ids)
        mx.eval(vars(self.draft_scorer))  # here, not on the engine's thread (see __init__)

    def draft_scoring(self) -> tuple[int, int]:
        if self.draft_scorer is None:
            return self.config.vocab_size, self.lm_head.nbytes()
        return self.draft_ids.size, self.draft_scorer.nbytes()

    def _draft_pass(self, spans: list, hidden: mx.array, cache: KVCache) -> mx.array:
        """The draft head over spans (seq_id, tokens, start): each span's tokens follow its hidden
        rows, which come in span order, as the output rows go."""
        batch = StepBatch(tuple(ScheduledChunk(seq_id, tokens, start, True) for seq_id, tokens, start in spans))
        step = self._layout(batch, cache, states=False)  # the head has no linear attention: no slots, no snapshots
        in_row_order = mx.argsort(step.in_chunk_order)  # the inverse permutation
        out = self.draft_head(self.embedding.rows(step.token_ids), hidden[in_row_order], cache, step, self.config,
                              self.attention)
        return out[step.in_chunk_order]

    def pool(self, batch: StepBatch, cache: KVCache, logit_ids: Sequence[int] | None) -> np.ndarray:
        """Pools: the final hidden rows, or the head's logits of logit_ids only."""
        hidden, step = self._residual(batch, cache)
        hidden = mx.fast.rms_norm(hidden[step.sample_rows], self.norm, self.config.rms_norm_eps)
        rows = hidden if logit_ids is None else self.lm_head(hidden)[:, mx.array(list(logit_ids))]
        return self.to_numpy(rows)

    def _layout(self, batch: StepBatch, cache: KVCache, states: bool = True) -> StepLayout:
        """states: the chunks' recurrent-state slots, snapshots taken for the prefix cache among
        them (asked once per chunk of the decoder's step: asking takes slots)."""
        sliding = cache if isinstance(cache, SlidingWindow) else None
        recurrent = cache if isinstance(cache, RecurrentState) and states else None
        return build_layout(batch, cache.block_size, cache.block_table, sliding, recurrent)

    def _residual(self, batch: StepBatch, cache: KVCache) -> tuple[mx.array, StepLayout]:
        """The residual stream after the last layer, every row in the layout's order."""
        step = self._layout(batch, cache)
        hidden = self.embedding.rows(step.token_ids)
        # each mixer addresses its own kind's layers: KV for attention, states for linear attention
        for index, layer in zip(self.mixer_indices, self.layers):
            hidden = run_layer(layer, index, hidden, cache, step, self.config, self.attention)
        return hidden, step
