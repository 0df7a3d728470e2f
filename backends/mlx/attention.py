"""GQA attention over the paged (or contiguous) KV cache, read through the KVCache Protocol:
one write and one gather per layer, then mx.fast.scaled_dot_product_attention once for all
single-token chunks and once per prefill chunk."""
from __future__ import annotations

from qwen_serve.protocols import KVCache

from .mx import mx
from .step_layout import StepLayout


class CachedAttention:
    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(
        self, layer: int, queries: mx.array, keys: mx.array, values: mx.array,
        cache: KVCache, step: StepLayout,
    ) -> mx.array:
        # queries [T, H, D]; keys/values [T, Hkv, D]; rows in the layout's order
        cache.write(layer, step.write_slots, keys, values)
        k_all, v_all = cache.read(layer, step.read_slots)  # [N, Hkv, D]
        outputs = []
        B, L = step.num_decodes, step.decode_len
        if B:
            k = k_all[:B * L].reshape(B, L, *k_all.shape[1:]).transpose(0, 2, 1, 3)  # [B, Hkv, L, D]
            v = v_all[:B * L].reshape(B, L, *v_all.shape[1:]).transpose(0, 2, 1, 3)
            q = queries[:B][:, :, None, :]  # [B, H, 1, D]
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=step.decode_mask)
            outputs.append(o[:, :, 0, :])
        for span in step.prefills:
            q = queries[span.rows].transpose(1, 0, 2)[None]  # [1, H, n, D]
            k = k_all[span.keys].transpose(1, 0, 2)[None]  # [1, Hkv, start + n, D]
            v = v_all[span.keys].transpose(1, 0, 2)[None]
            # "causal" aligns the last query with the last key: query i sees positions <= start + i;
            # a sliding window brings its own mask
            mask = "causal" if span.mask is None else span.mask
            o = mx.fast.scaled_dot_product_attention(q, k, v, scale=self.scale, mask=mask)
            outputs.append(o[0].transpose(1, 0, 2))
        return outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=0)
