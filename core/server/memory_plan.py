"""The start-up summary: geometry, KV bytes per token / block / pool, weight bytes, and the
compute paths a backend chose by timing.

KV sizes come from the storage the cache was built on (``KVStorage.bytes_per_token``), so a
quantized cache shows its own figure, scales included, not one guessed from the dtype flag."""
from __future__ import annotations

from typing import Any

from ..kv.hybrid import HybridCache
from ..kv.memory import blocks_spanned, format_bytes
from ..protocols import (
    ChoosesKernels,
    NarrowsDraftVocabulary,
    PrefixCaching,
    ReadsRoutedExperts,
    RecurrentState,
    SlidingWindow,
)
from ..sampling.defaults import SamplingDefaults


def mib(n: int) -> str:
    return f"{n / 2**20:,.1f} MiB"


def read_per_token(executor: Any) -> str:
    """', X MiB read per decoded token (...)' for a mixture of experts, else nothing."""
    if not isinstance(executor, ReadsRoutedExperts) or executor.active_weight_bytes() == executor.weight_bytes():
        return ""
    return f", {mib(executor.active_weight_bytes())} read per decoded token (its routed experts only)"


def draft_vocabulary_note(executor: Any, vocab_size: int) -> str:
    """'; drafts scored over N of V tokens, X MiB of the head a round' where the head is narrowed."""
    if not isinstance(executor, NarrowsDraftVocabulary):
        return ""
    tokens, head_bytes = executor.draft_scoring()
    if tokens == vocab_size:
        return ""
    return f"; drafts scored over {tokens:,} of {vocab_size:,} tokens (--draft-vocab), {mib(head_bytes)} of the head a round"


def format_memory_plan(parts: Any, dtype: str, quant: str, sampling_defaults: SamplingDefaults | None = None) -> str:
    """sampling_defaults: what requests that leave sampling fields out get (None: no line)."""
    m = parts.model_config
    e = parts.engine_config
    per_token = parts.storage.bytes_per_token()
    per_block = per_token * e.block_size
    lines = [
        f"model      {m.name} ({m.architecture}): {m.num_layers} layers, hidden {m.hidden_size}, "
        f"{m.num_heads} q heads / {m.num_kv_heads} kv heads x head_dim {m.head_dim}, vocab {m.vocab_size}",
        f"backend    {parts.backend.name}, KV cache {type(parts.cache).__name__} on {type(parts.storage).__name__}, "
        f"dtype {dtype}, quant {quant}, KV {e.kv_dtype} ({parts.kv_dtype_reason})",
        f"weights    {mib(parts.executor.weight_bytes())}{read_per_token(parts.executor)}"
        + (f"; {quant} calibration {parts.calibration}" if parts.calibration else ""),
        f"KV cache   {per_token:,} B/token ({per_token / 1024:.1f} KiB), {mib(per_block)}/block of "
        f"{e.block_size} tokens, pool {e.kv_blocks} blocks = {mib(per_block * e.kv_blocks)} "
        f"(grown {e.slab_blocks} blocks at a time)",
    ]
    if isinstance(parts.cache, RecurrentState):
        linear, state = len(m.linear_attention()), parts.cache.state_storage.bytes_per_slot()
        slots = parts.cache.usage().states_total
        per_sequence = parts.cache.draft_slots if isinstance(parts.cache, HybridCache) else 0
        drafts = f" ({per_sequence} of them per sequence to roll rejected drafts back to)" if per_sequence else ""
        lines.append(f"states     {linear} of {m.num_layers} layers are linear attention: {format_bytes(state)} of float32 "
                     f"state per sequence whatever its length (as much as {state // max(per_token, 1):,} tokens of KV), "
                     f"{slots} slots = {format_bytes(state * slots)} at most{drafts}; the KV above is the "
                     f"{m.kv_layers} attention layers'")
    if isinstance(parts.cache, SlidingWindow):
        held = blocks_spanned(parts.cache.window, e.block_size)
        lines.append(f"window     {parts.cache.window} tokens: a decoding sequence holds at most {held} blocks "
                     f"({mib(held * per_block)}) whatever its length")
    lines.append(
        f"scheduler  max batch {e.max_batch} sequences, step budget {e.step_budget} tokens, "
        f"prefill chunk {e.chunk_size} tokens, max sequence {parts.engine.max_seq_len} tokens, "
        f"prefix cache {'on' if e.prefix_cache and isinstance(parts.cache, PrefixCaching) else 'off'}")
    if e.speculative and parts.engine.drafter is not None:
        lines.append(f"speculate  {e.speculative}, up to {e.num_speculative_tokens} drafts a sequence a step"
                     + draft_vocabulary_note(parts.executor, m.vocab_size))
    if e.task != "generate":
        served = ("POST /v1/embeddings: the last token's final hidden state, L2-normalised" if e.task == "embed"
                  else "POST /v1/rerank and /v1/score: P(yes) of Qwen3-Reranker's verdict")
        lines.append(f"task       {e.task} ({served}{'; no language-model head' if not m.head else ''})")
    elif sampling_defaults is not None:
        lines.append(f"sampling   for fields a request leaves out: {sampling_defaults.describe()} "
                     f"(checkpoint's generation_config.json {'values' if sampling_defaults.as_dict() else 'has none'}; "
                     "--generation-config none: the API's defaults)")
    if isinstance(parts.executor, ChoosesKernels) and (table := parts.executor.kernel_table()):
        lines.append("kernels    chosen by timing on this CPU, ms at each end of each row class (* chosen, ! forced)")
        lines += [f"           {line}" for line in table]
    return "\n".join(lines)
