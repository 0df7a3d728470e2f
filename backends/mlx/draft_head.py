"""A checkpoint's multi-token-prediction head on MLX: one pass of it (qwen_serve.models.draft_head
holds its tensors' layout and the greedy rounds)."""
from __future__ import annotations

from qwen_serve.models.config import ModelConfig
from qwen_serve.models.draft_head import DraftHeadWeights
from qwen_serve.models.weights import TensorsByName

from .decoder_layer import LayerWeights, build_layer, run_layer
from .mx import mx


class DraftHeadLayers(DraftHeadWeights):
    @classmethod
    def build(cls, config: ModelConfig, tensors: TensorsByName, make_linear) -> "DraftHeadLayers":
        return cls.load(config, tensors, make_linear, lambda t: t.astype(mx.float32), lambda description, prefix:
                        build_layer(description, LayerWeights(tensors, prefix, make_linear, config.norm_offset)))

    def __call__(self, embedded: mx.array, hidden: mx.array, cache, step, config: ModelConfig, attention) -> mx.array:
        """embedded: the next tokens' embeddings [T, hidden]; hidden: the final hidden states
        they follow [T, hidden], both in the step's row order -> the head's normed output."""
        eps = config.rms_norm_eps
        joined = mx.concatenate([mx.fast.rms_norm(embedded, self.embedding_norm, eps),
                                 mx.fast.rms_norm(hidden, self.hidden_norm, eps)], axis=-1)
        h = self.fc(joined).astype(mx.float32)
        for layer, index in zip(self.layers, self.kv_layers):
            h = run_layer(layer, index, h, cache, step, config, attention)
        return mx.fast.rms_norm(h, self.norm, eps)
