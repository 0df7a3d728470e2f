"""The decoder on torch, built from an architecture's description (qwen_serve.models): the
embedding, the decoder layers in the order the description lists their kinds
(decoder_layer.py), the final norm and the head; weights in plain tensors.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from qwen_serve.errors import ModelLoadError
from qwen_serve.heap import return_free_heap
from qwen_serve.models.built_layer import skipped_expert_bytes
from qwen_serve.models.config import ModelConfig
from qwen_serve.models.draft_head import greedy_drafts
from qwen_serve.models.weights import EMBEDDING, FINAL_NORM, TensorsByName, language_model_head, layer_prefix
from qwen_serve.protocols import DraftRequest, KVCache, ScheduledChunk, StepBatch

from . import delta_block
from .attention import CachedAttention
from .decoder_layer import LayerWeights, build_layer
from .draft_head import DraftHeadLayers
from .fused_decode import FusedDecode
from .gated_deltanet import state_layout
from .huge_pages import move_to_huge_pages
from .kernel_choice import choose_paths, describe
from .layer_ops import LayerOps
from .linear import DenseLinear
from .native import load_kernels
from .paged_decode import paged_decode_layout
from .step_layout import StepLayout, build_layout


class DecoderModel:
    def __init__(self, config: ModelConfig, weights: dict[str, torch.Tensor], make_linear=DenseLinear) -> None:
        self.config = config
        c = config
        if len(c.layers) != c.num_layers:
            raise ModelLoadError(f"{c.architecture}: no layer description to build {c.num_layers} layers from")
        tensors = TensorsByName(weights)
        # The embedding is a linear-like table (lookup() gives rows): float, or quantized by the
        # backend while loading; a tied lm_head is the very same object.
        self.embed = make_linear(tensors.take(EMBEDDING), None)
        self.layers = []
        for i, description in enumerate(c.layers):
            self.layers.append(build_layer(description, LayerWeights(tensors, layer_prefix(i), make_linear,
                                                                     c.norm_offset)))
            return_free_heap()  # the loaded tensors this layer was made from (else ~2x the weights at the end)
        self.norm = tensors.take(FINAL_NORM).float() + c.norm_offset
        self.draft_head = DraftHeadLayers.build(c, tensors, make_linear) if c.draft_layers else None
        self._last_step: tuple[StepBatch, torch.Tensor] | None = None  # (batch, final hidden rows) for the head
        self.draft_ids: torch.Tensor | None = None  # the tokens drafts are scored over (None: all)
        self.draft_scorer = None  # the head's rows of draft_ids (narrow_draft_vocabulary)
        self.mixer_indices = c.mixer_indices()  # each layer's KV layer or state layer
        self.recurrent = bool(c.linear_attention())
        self.lm_head = language_model_head(c, tensors, self.embed, make_linear)
        tensors.check_all_taken()
        self.kernels = kernels = load_kernels()
        if isinstance(self.lm_head, DenseLinear):
            self.lm_head.as_head(kernels)  # float32 logits; a tied table keeps lookup()
        # each packed shape's path per row count (a bf16 projection's layout too), then the layouts
        multiplied = [linear for linear in self.linears() if linear is not self.embed or linear is self.lm_head]
        self.kernel_choices = choose_paths(multiplied, kernels)
        self.delta_blocks = delta_block.choose_delta_blocks(self.built_layers(), kernels)
        drafts_fc = self.draft_head.linears() if self.draft_head is not None else []  # float: not a projection
        for linear in [linear for layer in self.built_layers() for linear in layer.linears()] + drafts_fc:
            if isinstance(linear, DenseLinear):
                linear.prepack(kernels)
        if move_to_huge_pages(self.linears()):
            return_free_heap()  # the old copies
        self.attention = CachedAttention(scale=c.head_dim ** -0.5)
        self.ops = LayerOps(kernels)
        self.fused = FusedDecode.for_layers(self.layers, kernels)  # None: every step goes op by op
        rotary = c.rotary_dims
        self.inv_freq = 1.0 / (c.rope_theta ** (torch.arange(0, rotary, 2, dtype=torch.int64).float() / rotary))
        self._rope_table = (torch.empty(0, rotary), torch.empty(0, rotary))

    def built_layers(self) -> list:
        """The decoder layers, then the draft head's (if built)."""
        return self.layers + (self.draft_head.layers if self.draft_head is not None else [])

    def projections(self):
        """Calibratable.projections, layer by layer."""
        for layer in self.built_layers():
            yield from layer.projections()

    @staticmethod
    def to_numpy(x: torch.Tensor):
        return x.detach().float().numpy()

    def linears(self) -> list:
        """Every weight-holding layer once: the embedding, the head (a tied head is the same
        object) and each decoder layer's projections."""
        every = [self.embed, self.lm_head] + [linear for layer in self.built_layers() for linear in layer.linears()]
        every += self.draft_head.linears() if self.draft_head is not None else []
        every.append(self.draft_scorer)
        return list({id(linear): linear for linear in every if linear is not None}.values())

    def kernel_table(self) -> list[str]:
        """KernelReport: the timings each quantized projection's paths were chosen from."""
        return describe(self.kernel_choices) + [delta_block.describe(*geometry, seconds, chosen)
                                                for geometry, (chosen, seconds) in self.delta_blocks.items()]

    def weight_bytes(self) -> int:
        total = sum(lin.nbytes() for lin in self.linears())
        norms = [self.norm] + [t for layer in self.built_layers() for t in layer.norms()]
        norms += self.draft_head.norms() if self.draft_head is not None else []
        return total + sum(t.numel() * t.element_size() for t in norms)

    def active_weight_bytes(self) -> int:
        """ReadsRoutedExperts: what one decoded token reads."""
        return self.weight_bytes() - skipped_expert_bytes(self.layers)

    @torch.inference_mode()
    def execute(self, batch: StepBatch, cache: KVCache) -> torch.Tensor:
        if self.draft_head is None:
            return self.lm_head(self._final_hidden(batch, cache))
        hidden, sampled = self._final_hidden(batch, cache, every_row=True)
        self._last_step = (batch, hidden)
        return self.lm_head(hidden if sampled is None else hidden.index_select(0, sampled))

    @torch.inference_mode()
    def draft(self, requests: Sequence[DraftRequest], cache: KVCache) -> list[list[int]]:
        """DraftHead: greedy rounds of the head (qwen_serve.models.draft_head) from the last step."""
        batch, hidden = self._last_step
        return greedy_drafts(requests, batch.chunks, hidden, lambda spans, rows: self._draft_pass(spans, rows, cache),
                             lambda x, rows: x.index_select(0, torch.as_tensor(rows, dtype=torch.long)),
                             self._draft_guesses)

    def _draft_guesses(self, out: torch.Tensor) -> list[int]:
        if self.draft_scorer is None:
            return self.lm_head(out).argmax(-1).tolist()
        return self.draft_ids.index_select(0, self.draft_scorer(out).argmax(-1)).tolist()

    def narrow_draft_vocabulary(self, token_ids: Sequence[int] | None) -> None:
        """NarrowsDraftVocabulary: the head's rows of token_ids, in its own format, score drafts."""
        if token_ids is None:
            self.draft_ids = self.draft_scorer = None
            return
        self.draft_ids = torch.as_tensor(token_ids, dtype=torch.long)
        self.draft_scorer = self.lm_head.with_rows(self.draft_ids)
        if isinstance(self.draft_scorer, DenseLinear):
            self.draft_scorer.as_head(self.kernels)

    def draft_scoring(self) -> tuple[int, int]:
        if self.draft_scorer is None:
            return self.config.vocab_size, self.lm_head.nbytes()
        return self.draft_ids.numel(), self.draft_scorer.nbytes()

    def _draft_pass(self, spans: list, hidden: torch.Tensor, cache: KVCache) -> torch.Tensor:
        """The draft head over spans (seq_id, tokens, start): each span's tokens follow its hidden rows."""
        batch = StepBatch(tuple(ScheduledChunk(seq_id, tokens, start, True) for seq_id, tokens, start in spans))
        step = build_layout(batch, cache)
        step.paged = paged_decode_layout(step, cache, self.kernels)
        token_ids = torch.as_tensor([t for c in batch.chunks for t in c.token_ids], dtype=torch.long)
        cos, sin = self._rope(step.positions)
        return self.draft_head(self.embed.lookup(token_ids), hidden, cos, sin, cache, step, self.config, self.ops,
                               self.attention)

    @torch.inference_mode()
    def pool(self, batch: StepBatch, cache: KVCache, logit_ids: Sequence[int] | None) -> np.ndarray:
        """Pools: the final hidden rows, or the head's logits of logit_ids only."""
        hidden = self._final_hidden(batch, cache)
        rows = hidden if logit_ids is None else self.lm_head(hidden)[:, list(logit_ids)]
        return rows.float().numpy()

    def _final_hidden(self, batch: StepBatch, cache: KVCache, every_row: bool = False):
        """The final norm's output at the sampled positions; with every_row, (the output at every
        row, the sampled rows among them or None for all)."""
        step = build_layout(batch, cache)
        step.paged = paged_decode_layout(step, cache, self.kernels)
        if self.recurrent:
            step.states = state_layout(batch, cache)
        token_ids = torch.as_tensor([t for c in batch.chunks for t in c.token_ids], dtype=torch.long)
        hidden = self.embed.lookup(token_ids)
        cos, sin = self._rope(step.positions)
        ops, eps = self.ops, self.config.rms_norm_eps
        x = ops.rms_norm(hidden, self.layers[0].input_norm, eps)
        if self.fused is not None and self.fused.applies(len(token_ids), step, cache):
            mlp = self.fused(hidden, x, cos, sin, step, cache, self.config, self.attention.scale)  # hidden in place
        else:
            hidden, mlp = self._layers(hidden, x, cos, sin, cache, step)
        if every_row:
            return ops.rms_norm(hidden + mlp, self.norm, eps), None if step.all_rows_sampled else step.sample_rows
        if step.all_rows_sampled:
            last = hidden + mlp
        else:
            last = hidden.index_select(0, step.sample_rows) + mlp.index_select(0, step.sample_rows)
        return ops.rms_norm(last, self.norm, eps)

    def _layers(self, hidden: torch.Tensor, x: torch.Tensor, cos, sin, cache: KVCache,
                step: StepLayout) -> tuple[torch.Tensor, torch.Tensor]:
        """Every layer, op by op -> the residual before the last layer's MLP and that MLP's output
        (the last residual is added for the sampled rows only)."""
        ops, eps = self.ops, self.config.rms_norm_eps
        for index, layer in enumerate(self.layers):
            mixed = layer.mixer(self.mixer_indices[index], x, cos, sin, cache, step, self.config, ops, self.attention)
            hidden, x = ops.add_rms_norm(hidden, mixed, layer.post_norm, eps)
            mlp = layer.mlp(x, ops)
            if index + 1 < len(self.layers):
                hidden, x = ops.add_rms_norm(hidden, mlp, self.layers[index + 1].input_norm, eps)
        return hidden, mlp

    def _rope(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and sin [T, head_dim] at the positions: rows of a table of every position below the
        highest seen, rounded up to 4,096 (4 MiB for Qwen3's head_dim). Computed per step (a cos
        and a sin of a few elements) they took 3.5% of a single-stream int4 step (py-spy)."""
        top = int(positions.max()) + 1 if positions.numel() else 0
        if top > self._rope_table[0].shape[0]:
            freqs = torch.arange(-(-top // 4096) * 4096).float()[:, None] * self.inv_freq[None, :]
            emb = torch.cat((freqs, freqs), dim=-1)
            self._rope_table = (emb.cos(), emb.sin())
        return tuple(t.index_select(0, positions) for t in self._rope_table)
