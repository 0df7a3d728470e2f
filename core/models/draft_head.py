"""A checkpoint's multi-token-prediction head (ModelConfig.draft_layers; Qwen3.5's mtp.*): its
tensors, and how a backend drafts with it greedily. Shared by the backends because the names and
the rounds are the same; only the arithmetic of one pass differs.

At position p the head reads the main model's final hidden state h_p and the embedding of the
token after p, each RMS-normed, joined [embedding, hidden] and projected back to the hidden width
by fc; then its decoder layer(s), whose attention keeps keys and values of its own in the KV
layers after the decoder's; then its norm. Its output scored by the shared language-model head
guesses the token two after p; fed back as the hidden state with that guess's embedding, it
guesses the next one, and so on."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

import numpy as np

from .config import ModelConfig
from .weights import TensorsByName

PREFIX = "mtp"


@dataclass
class DraftHeadWeights:
    """The head's tensors; a backend subclasses it with one pass of the head (__call__)."""

    embedding_norm: Any  # float32, norm_offset added, as every decoder norm
    hidden_norm: Any
    fc: Any  # the backend's linear: [embedding, hidden] (2 * hidden) -> hidden
    layers: list  # BuiltLayer each
    norm: Any
    kv_layers: list[int]  # each draft layer's KV layer (after the decoder's)

    @classmethod
    def load(cls, config: ModelConfig, tensors: TensorsByName, make_linear: Callable,
             float_norm: Callable[[Any], Any], build_layer: Callable[[Any, str], Any]):
        """float_norm: a stored norm scale -> float32 (norm_offset is added here); build_layer:
        (description, weight-name prefix) -> the backend's BuiltLayer."""
        hidden = config.hidden_size
        tensors.check_shapes({f"{PREFIX}.fc.weight": (hidden, 2 * hidden)})
        norm = lambda name: float_norm(tensors.take(f"{PREFIX}.{name}.weight")) + config.norm_offset  # noqa: E731
        return cls(embedding_norm=norm("pre_fc_norm_embedding"), hidden_norm=norm("pre_fc_norm_hidden"),
                   fc=make_linear(tensors.take(f"{PREFIX}.fc.weight"), None),
                   layers=[build_layer(description, f"{PREFIX}.layers.{i}")
                           for i, description in enumerate(config.draft_layers)],
                   norm=norm("norm"), kv_layers=config.mixer_indices()[len(config.layers):])

    def linears(self) -> list:
        """What the head holds beside its decoder layers (the model walks those with its own)."""
        return [self.fc]

    def norms(self) -> list:
        return [self.embedding_norm, self.hidden_norm, self.norm]


Span = tuple  # (seq_id, token ids, first position): tokens the head runs on, one sequence's


def greedy_drafts(requests: Sequence[Any], last_chunks: Sequence[Any], hidden: Any,
                  head_pass: Callable[[list[Span], Any], Any], take_rows: Callable[[Any, list[int]], Any],
                  argmax: Callable[[Any], list[int]]) -> list[list[int]]:
    """DraftHead.draft for DraftRequests: the head over each request's kept rows of the last step
    (hidden: that step's final hidden states, one row per token of last_chunks, the step's
    ScheduledChunks, in their order), then on its own guesses, one position further each round.
    head_pass(spans, rows) runs the head on the spans (as chunks of one step, each sampled), the
    hidden rows they follow given in span order, one output row per token in that order; argmax
    scores rows with the language-model head."""
    starts = np.cumsum([0] + [len(c.token_ids) for c in last_chunks])
    rows = [int(row) for r in requests for row in range(starts[r.chunk], starts[r.chunk] + len(r.next_tokens))]
    out = head_pass([(r.seq_id, r.next_tokens, r.start) for r in requests], take_rows(hidden, rows))
    drafts: list[list[int]] = [[] for _ in requests]
    active = [i for i, r in enumerate(requests) if r.num_draft]
    if not active:
        return drafts
    ends = np.cumsum([len(r.next_tokens) for r in requests]) - 1
    out = take_rows(out, [int(ends[i]) for i in active])
    for step in range(max(requests[i].num_draft for i in active)):
        guesses = argmax(out)
        for i, token in zip(active, guesses):
            drafts[i].append(int(token))
        going = [j for j, i in enumerate(active) if requests[i].num_draft > step + 1]
        if not going:
            break
        # the guess sits one past the head's last row: the position after the kept rows, plus step
        spans = [(requests[active[j]].seq_id, (guesses[j],),
                  requests[active[j]].start + len(requests[active[j]].next_tokens) + step) for j in going]
        out = head_pass(spans, take_rows(out, going))
        active = [active[j] for j in going]
    return drafts
