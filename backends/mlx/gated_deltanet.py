"""models.layers.GatedDeltaNet on MLX: the projections as any layer's, then the causal
convolution and the gated delta rule in float32 from the state the sequence's slot holds,
written back after. The rule runs in its recurrent form, one token at a time: the decoding
sequences of a step together, each prefill chunk on its own (correct and simple; the torch
backend has the chunked form for speed). A prefill chunk also leaves the state after each
boundary the cache asks for (RecurrentState.snapshot_slots) in that boundary's slot."""
from __future__ import annotations

from qwen_serve.models.config import ModelConfig
from qwen_serve.models.layers import GatedDeltaNet
from qwen_serve.protocols import RecurrentState

from .mx import mx
from .step_layout import ChunkState, StepLayout


class GatedDeltaNetLayer:
    def __init__(self, kind: GatedDeltaNet, weights) -> None:
        self.kind, self.prefix = kind, f"{weights.prefix}.{kind.prefix}"
        for p in kind.projections:
            setattr(self, p, weights.linear(kind.prefix, p, False))
        take = lambda name: weights.tensors.take(f"{self.prefix}.{name}").astype(mx.float32)  # noqa: E731
        self.gates = mx.concatenate([take("in_proj_a.weight"), take("in_proj_b.weight")])  # [2 * value heads, hidden]
        self.conv = take("conv1d.weight").reshape(kind.conv_channels, kind.conv_kernel)
        self.decay_rate = -mx.exp(take("A_log"))  # g = decay_rate * softplus(a + dt_bias)
        self.dt_bias = take("dt_bias")
        self.out_norm = take("norm.weight")  # a plain scale, not offset like the decoder's norms

    def linears(self) -> list:
        return [getattr(self, p) for p in self.kind.projections]

    def norms(self) -> list[mx.array]:
        """The float tensors beside the linears, as weight_bytes counts them."""
        return [self.gates, self.conv, self.decay_rate, self.dt_bias, self.out_norm]

    def projections(self):
        for p in self.kind.projections:
            yield f"{self.prefix}.{p}.weight", self, p

    def __call__(self, index: int, x: mx.array, cache: RecurrentState, step: StepLayout, config: ModelConfig,
                 attention) -> mx.array:
        kind, T = self.kind, x.shape[0]
        mixed = self.in_proj_qkv(x).astype(mx.float32)
        gate = self.in_proj_z(x).astype(mx.float32).reshape(T, kind.num_value_heads, kind.value_dim)
        a, b = mx.split(x.astype(mx.float32) @ self.gates.T, 2, axis=-1)
        g = self.decay_rate * mx.logaddexp(a + self.dt_bias, 0.0)  # softplus; the log of each decay
        beta = mx.sigmoid(b)
        decodes = [c for c in step.states if c.rows.stop - c.rows.start == 1]
        outputs = []
        if decodes:  # rows 0 .. B - 1 of the layout
            outputs.append(self._run(index, cache, decodes, mixed[:len(decodes)][:, None], g[:len(decodes)][:, None],
                                     beta[:len(decodes)][:, None]))
        for chunk in step.states[len(decodes):]:
            rows = chunk.rows
            outputs.append(self._run(index, cache, [chunk], mixed[rows][None], g[rows][None], beta[rows][None]))
        out = outputs[0] if len(outputs) == 1 else mx.concatenate(outputs, axis=0)  # [T, value heads, value_dim]
        normed = mx.fast.rms_norm(out, self.out_norm, config.rms_norm_eps)
        return self.out_proj((normed * gate * mx.sigmoid(gate)).reshape(T, -1))

    def _run(self, index: int, cache: RecurrentState, chunks: list[ChunkState], mixed: mx.array, g: mx.array,
             beta: mx.array) -> mx.array:
        """B sequences of n tokens each (one chunk, or B decodes of one): mixed [B, n, channels],
        g, beta [B, n, value heads] -> outputs [B * n, value heads, value_dim]; their slots
        updated, and the chunks' snapshots written."""
        kind, storage = self.kind, cache.state_storage
        slots = [c.slot for c in chunks]
        history, state = storage.read(index, slots)
        fresh = mx.array([c.fresh for c in chunks])
        history = mx.where(fresh[:, None, None], 0.0, history)
        state = mx.where(fresh[:, None, None, None], 0.0, state)
        window = mx.concatenate([history, mixed], axis=1)  # [B, taps - 1 + n, channels]
        taps, n = kind.conv_kernel, mixed.shape[1]
        convolved = sum(window[:, j:j + n] * self.conv[:, j] for j in range(taps))
        convolved = convolved * mx.sigmoid(convolved)
        key_width = kind.num_key_heads * kind.key_dim
        q, k, v = mx.split(convolved, [key_width, 2 * key_width], axis=-1)
        repeats = kind.num_value_heads // kind.num_key_heads
        q, k = (mx.repeat(unit_rows(t.reshape(*t.shape[:2], kind.num_key_heads, kind.key_dim)), repeats, axis=2)
                for t in (q, k))
        q = q * kind.key_dim ** -0.5
        v = v.reshape(*v.shape[:2], kind.num_value_heads, kind.value_dim)
        outputs = []
        for t in range(n):
            state = state * mx.exp(g[:, t])[..., None, None]
            predicted = (state * k[:, t, :, :, None]).sum(axis=2)  # S^T k: [B, H, value_dim]
            state = state + k[:, t, :, :, None] * (beta[:, t, :, None] * (v[:, t] - predicted))[:, :, None, :]
            outputs.append((state * q[:, t, :, :, None]).sum(axis=2))
            for b, chunk in enumerate(chunks):  # (rows in, slot): the history after t + 1 rows is the taps - 1
                taken = [slot for rows, slot in chunk.snapshots if rows == t + 1]  # inputs before it
                if taken:
                    storage.write(index, taken, mx.repeat(window[b:b + 1, t + 1:t + taps], len(taken), axis=0),
                                  mx.repeat(state[b:b + 1], len(taken), axis=0))
        storage.write(index, slots, window[:, n:], state)
        return mx.stack(outputs, axis=1).reshape(-1, kind.num_value_heads, kind.value_dim)


def unit_rows(x: mx.array, eps: float = 1e-6) -> mx.array:
    """Each vector over the last dimension divided by its L2 norm (eps inside the root)."""
    return x * mx.rsqrt((x * x).sum(axis=-1, keepdims=True) + eps)
