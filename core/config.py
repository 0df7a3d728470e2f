"""Engine settings: a plain frozen dataclass, no framework types (a model's own settings are
qwen_serve.models.config.ModelConfig)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .models.config import ModelConfig

BATCHING_MODES = ("continuous", "static")
SCHEDULING_POLICIES = ("fcfs", "priority")
TASKS = ("generate", "embed", "rerank")  # what the engine serves (qwen_serve.pooling.task picks one)


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler and KV-pool settings, with the defaults docs/serving.md lists."""

    block_size: int = 16
    kv_blocks: int = 512
    slab_blocks: int = 32
    max_batch: int = 16  # 16 streams decode 1.1x (int4) to 1.35x (bf16) faster in aggregate than 8 (benchmarks/bench_decode.py)
    step_budget: int = 2048
    chunk_size: int = 512
    max_seq_len: int | None = None
    prefix_cache: bool = True
    seed: int | None = None
    batching: str = "continuous"  # or "static": a new batch only once the last one has finished
    scheduling_policy: str = "fcfs"  # "priority": lower request priority values are served first
    kv_window: int | None = None  # for a sliding-window KV cache: positions each query attends over
    kv_dtype: str | None = None  # KV storage dtype: None = the weights' dtype, "auto" = the backend's choice
    speculative: str | None = None  # a registered proposer (e.g. "ngram"): speculative decoding on
    num_speculative_tokens: int = 4  # proposals verified per sequence per step, at most
    # a draft head (mtp) scores only these tokens: N (the N lowest ids) or a file of ids; None: all
    draft_vocab: int | str | None = None
    task: str = "generate"  # or "embed" / "rerank": prefill-only requests that return hidden states or scores
    # A model with linear attention: memory for the prefix cache's recurrent states at block boundaries
    state_cache_mib: int = 1024
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_blocks", "slab_blocks", "max_batch", "step_budget", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if not isinstance(self.state_cache_mib, int) or self.state_cache_mib < 0:
            raise ValueError(f"state_cache_mib must be a whole number of MiB, got {self.state_cache_mib!r}")
        if self.kv_dtype is not None and not isinstance(self.kv_dtype, str):
            raise ValueError(f"kv_dtype must be a dtype name or 'auto', got {self.kv_dtype!r}")
        if self.kv_window is not None and (not isinstance(self.kv_window, int) or self.kv_window <= 0):
            raise ValueError(f"kv_window must be a positive integer, got {self.kv_window!r}")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens <= 0:
            raise ValueError(f"num_speculative_tokens must be a positive integer, got {self.num_speculative_tokens!r}")
        vocab = self.draft_vocab
        if vocab is not None and not (vocab if isinstance(vocab, str) else type(vocab) is int and vocab > 0):
            raise ValueError(f"draft_vocab must be a positive number of tokens or a file of token ids, "
                             f"got {self.draft_vocab!r}")
        if self.max_seq_len is not None and self.max_seq_len <= 0:
            raise ValueError(f"max_seq_len must be positive, got {self.max_seq_len!r}")
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {', '.join(BATCHING_MODES)}, got {self.batching!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {self.scheduling_policy!r}")
        if self.task not in TASKS:
            raise ValueError(f"task must be one of {', '.join(TASKS)}, got {self.task!r}")
        if self.step_budget < self.max_batch:
            raise ValueError("step_budget must be at least max_batch so every decode gets a token")

    def resolved_max_seq_len(self, model: ModelConfig) -> int:
        """Longest sequence (prompt + generated) a request may reach, in tokens."""
        pool_tokens = self.kv_blocks * self.block_size
        limit = min(model.max_position_embeddings, pool_tokens)
        return min(self.max_seq_len, limit) if self.max_seq_len else limit
