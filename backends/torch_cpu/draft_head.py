"""A checkpoint's multi-token-prediction head on torch (ModelConfig.draft_layers; Qwen3.5's mtp.*).

At position p it reads the main model's final hidden state h_p and the embedding of the token
after p, each RMS-normed, joined [embedding, hidden] and projected back to the hidden width by
fc; then its decoder layer(s), whose attention keeps keys and values of its own in the KV layers
after the decoder's; then its norm. The head's output scored by the shared language-model head
guesses the token two after p; fed back as the hidden state with that guess's embedding, it
guesses the next one, and so on."""
from __future__ import annotations

import torch

from qwen_serve.models.config import ModelConfig
from qwen_serve.models.weights import TensorsByName

from .decoder_layer import LayerWeights, build_layer

PREFIX = "mtp"


class DraftHeadLayers:
    def __init__(self, config: ModelConfig, tensors: TensorsByName, make_linear) -> None:
        offset = config.norm_offset
        take_norm = lambda name: tensors.take(f"{PREFIX}.{name}.weight").float() + offset  # noqa: E731
        hidden = config.hidden_size
        tensors.check_shapes({f"{PREFIX}.fc.weight": (hidden, 2 * hidden)})
        self.embedding_norm = take_norm("pre_fc_norm_embedding")
        self.hidden_norm = take_norm("pre_fc_norm_hidden")
        self.fc = make_linear(tensors.take(f"{PREFIX}.fc.weight"), None)
        self.layers = [build_layer(description, LayerWeights(tensors, f"{PREFIX}.layers.{i}", make_linear, offset))
                       for i, description in enumerate(config.draft_layers)]
        self.norm = take_norm("norm")
        first = len(config.layers)
        self.kv_layers = config.mixer_indices()[first:]  # each draft layer's KV layer

    def linears(self) -> list:
        """What the head holds beside its decoder layers (the model walks those with its own)."""
        return [self.fc]

    def norms(self) -> list[torch.Tensor]:
        return [self.embedding_norm, self.hidden_norm, self.norm]

    def __call__(self, embedded: torch.Tensor, hidden: torch.Tensor, cos, sin, cache, step, config: ModelConfig,
                 ops, attention) -> torch.Tensor:
        """embedded: the next tokens' embeddings [T, hidden]; hidden: the final hidden states
        they follow [T, hidden] -> the head's normed output [T, hidden]."""
        eps = config.rms_norm_eps
        joined = torch.cat([ops.rms_norm(embedded, self.embedding_norm, eps), ops.rms_norm(hidden, self.hidden_norm, eps)],
                           dim=-1)
        h = self.fc(joined).float().contiguous()
        for layer, index in zip(self.layers, self.kv_layers):
            x = ops.rms_norm(h, layer.input_norm, eps)
            mixed = layer.mixer(index, x, cos, sin, cache, step, config, ops, attention)
            h, x = ops.add_rms_norm(h, mixed, layer.post_norm, eps)
            h = h + layer.mlp(x, ops)
        return ops.rms_norm(h, self.norm, eps)
