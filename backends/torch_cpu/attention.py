"""GQA attention over the paged (or contiguous) KV cache, read through the KVCache Protocol."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from qwen_serve.protocols import KVCache

from .step_layout import StepLayout


class CachedAttention:
    """Writes the step's keys/values, then attends each query over its sequence's history."""

    def __init__(self, scale: float) -> None:
        self.scale = scale

    def __call__(
        self, layer: int, queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
        cache: KVCache, step: StepLayout,
    ) -> torch.Tensor:
        # queries [T, H, D]; keys/values [T, Hkv, D]
        # keys and values are column slices of the merged q/k/v output: the backend's own storage
        # takes them so (kv_write.cpp), any other cache whole
        in_place = step.paged is not None  # the backend's own storage, read in place (paged_decode.py)
        cache.write(layer, step.write_slots, *((keys, values) if in_place else (keys.contiguous(), values.contiguous())))
        if in_place and not step.prefills:  # every row decodes: the kernel's output is the answer
            return step.paged.attend(layer, queries, self.scale)
        out = torch.empty_like(queries)
        if in_place:
            out[step.decode_rows] = step.paged.attend(layer, queries[step.decode_rows], self.scale)
        elif step.decode_rows.numel():
            k, v = cache.read(layer, step.decode_slots)  # [B, L, Hkv, D]: one gather for all decodes
            q = queries[step.decode_rows]  # [B, H, D]
            # One attention per sequence over its own keys: padded to the batch's longest, the
            # kernel splits the keys otherwise and rounds otherwise, and a seeded request's draw
            # then depends on who else is decoding (conformance check 1 over HTTP). 4-D, or torch
            # takes its unfused "math" path (GQA keys repeated, then scaled): 45 against 1.3 ms
            # for one query over 4,096 keys of Qwen3.5-0.8B's geometry on 2 Zen 3 cores.
            for i, length in enumerate(step.decode_lengths):
                o = F.scaled_dot_product_attention(
                    q[None, i, :, None, :], k[None, i, :length].transpose(1, 2), v[None, i, :length].transpose(1, 2),
                    scale=self.scale, enable_gqa=True,
                )
                out[step.decode_rows[i]] = o[0, :, 0, :]
        for span in step.prefills:
            k, v = cache.read(layer, span.key_slots)  # [L, Hkv, D]
            q = queries[span.rows].transpose(0, 1).unsqueeze(0)  # [1, H, n, D]
            o = F.scaled_dot_product_attention(
                q, k.transpose(0, 1).unsqueeze(0), v.transpose(0, 1).unsqueeze(0),
                attn_mask=span.mask, is_causal=span.mask is None, scale=self.scale, enable_gqa=True,
            )
            out[span.rows] = o.squeeze(0).transpose(0, 1)
        return out
