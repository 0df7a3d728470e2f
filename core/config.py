"""Model geometry and engine settings: plain frozen dataclasses, no framework types."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

SUPPORTED_ARCHITECTURES = ("Qwen3ForCausalLM", "LlamaForCausalLM")
BATCHING_MODES = ("continuous", "static")
SCHEDULING_POLICIES = ("fcfs", "priority")


def sliding_window_layers(cfg: dict[str, Any]) -> tuple[int | None, tuple[bool, ...]]:
    """(window, which layers attend over only the last `window` positions), by transformers'
    rule for Qwen2/Qwen3 configs: nothing slides unless ``use_sliding_window``; then
    ``layer_types`` says which layers do, or else every layer from ``max_window_layers`` on."""
    layers = cfg["num_hidden_layers"]
    window = cfg.get("sliding_window") if cfg.get("use_sliding_window") else None
    if window is None:
        return None, (False,) * layers
    types = cfg.get("layer_types")
    if types is None:
        first = cfg.get("max_window_layers", layers)
        return window, tuple(i >= first for i in range(layers))
    return window, tuple(t == "sliding_attention" for t in types)


@dataclass(frozen=True)
class ModelConfig:
    """What a backend needs to build the decoder; read from config.json or GGUF metadata."""

    architecture: str
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_layers: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    rope_theta: float
    rms_norm_eps: float
    max_position_embeddings: int
    tie_word_embeddings: bool
    qk_norm: bool
    eos_token_ids: tuple[int, ...] = ()
    bos_token_id: int | None = None
    name: str = "model"
    sliding_window: int | None = None  # every layer attends over only the last this many positions

    @classmethod
    def from_hf_config(cls, cfg: dict[str, Any], name: str = "model") -> "ModelConfig":
        archs = cfg.get("architectures") or [""]
        arch = archs[0]
        if arch not in SUPPORTED_ARCHITECTURES:
            raise ValueError(
                f"unsupported architecture {arch!r}; supported: {', '.join(SUPPORTED_ARCHITECTURES)}"
            )
        window, sliding = sliding_window_layers(cfg)
        if any(sliding) and not all(sliding):
            raise ValueError(f"hybrid attention is not supported: {sum(sliding)} of {len(sliding)} layers "
                             f"attend over a sliding window of {window} tokens, the others over everything")
        heads = cfg["num_attention_heads"]
        # transformers 5 nests rope settings under rope_parameters; 4.x keeps rope_theta flat.
        rope = cfg.get("rope_parameters") or {}
        rope_theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        rope_type = rope.get("rope_type") or (cfg.get("rope_scaling") or {}).get("rope_type", "default")
        if rope_type not in ("default", None):
            raise ValueError(f"rope scaling {rope_type!r} is not supported")
        eos = cfg.get("eos_token_id")
        eos_ids = tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,))
        return cls(
            architecture=arch,
            vocab_size=cfg["vocab_size"],
            hidden_size=cfg["hidden_size"],
            intermediate_size=cfg["intermediate_size"],
            num_layers=cfg["num_hidden_layers"],
            num_heads=heads,
            num_kv_heads=cfg.get("num_key_value_heads", heads),
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            rope_theta=float(rope_theta),
            rms_norm_eps=float(cfg.get("rms_norm_eps", 1e-6)),
            max_position_embeddings=cfg.get("max_position_embeddings", 4096),
            tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            qk_norm=arch == "Qwen3ForCausalLM",
            eos_token_ids=eos_ids,
            bos_token_id=cfg.get("bos_token_id"),
            name=name,
            sliding_window=window if all(sliding) else None,
        )

    def with_eos(self, extra: tuple[int, ...]) -> "ModelConfig":
        merged = tuple(dict.fromkeys(self.eos_token_ids + extra))
        return dataclasses.replace(self, eos_token_ids=merged)


@dataclass(frozen=True)
class EngineConfig:
    """Scheduler and KV-pool settings (SPEC §3 defaults)."""

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
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name in ("block_size", "kv_blocks", "slab_blocks", "max_batch", "step_budget", "chunk_size"):
            value = getattr(self, name)
            if not isinstance(value, int) or value <= 0:
                raise ValueError(f"{name} must be a positive integer, got {value!r}")
        if self.kv_dtype is not None and not isinstance(self.kv_dtype, str):
            raise ValueError(f"kv_dtype must be a dtype name or 'auto', got {self.kv_dtype!r}")
        if self.kv_window is not None and (not isinstance(self.kv_window, int) or self.kv_window <= 0):
            raise ValueError(f"kv_window must be a positive integer, got {self.kv_window!r}")
        if not isinstance(self.num_speculative_tokens, int) or self.num_speculative_tokens <= 0:
            raise ValueError(f"num_speculative_tokens must be a positive integer, got {self.num_speculative_tokens!r}")
        if self.max_seq_len is not None and self.max_seq_len <= 0:
            raise ValueError(f"max_seq_len must be positive, got {self.max_seq_len!r}")
        if self.batching not in BATCHING_MODES:
            raise ValueError(f"batching must be one of {', '.join(BATCHING_MODES)}, got {self.batching!r}")
        if self.scheduling_policy not in SCHEDULING_POLICIES:
            raise ValueError(f"scheduling_policy must be one of {', '.join(SCHEDULING_POLICIES)}, "
                             f"got {self.scheduling_policy!r}")
        if self.step_budget < self.max_batch:
            raise ValueError("step_budget must be at least max_batch so every decode gets a token")

    def resolved_max_seq_len(self, model: ModelConfig) -> int:
        """Longest sequence (prompt + generated) a request may reach, in tokens."""
        pool_tokens = self.kv_blocks * self.block_size
        limit = min(model.max_position_embeddings, pool_tokens)
        return min(self.max_seq_len, limit) if self.max_seq_len else limit
