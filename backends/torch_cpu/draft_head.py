"""A checkpoint's multi-token-prediction head on torch: one pass of it (qwen_serve.models.draft_head
holds its tensors' layout and the greedy rounds)."""
from __future__ import annotations

import torch

from qwen_serve.models.config import ModelConfig
from qwen_serve.models.draft_head import DraftHeadWeights
from qwen_serve.models.weights import TensorsByName

from .decoder_layer import LayerWeights, build_layer


class DraftHeadLayers(DraftHeadWeights):
    @classmethod
    def build(cls, config: ModelConfig, tensors: TensorsByName, make_linear) -> "DraftHeadLayers":
        return cls.load(config, tensors, make_linear, lambda t: t.float(), lambda description, prefix: build_layer(
            description, LayerWeights(tensors, prefix, make_linear, config.norm_offset)))

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
