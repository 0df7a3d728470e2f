"""Assemble an engine from names: checkpoint path, backend, KV cache, dtype, quant."""
from __future__ import annotations

import gc
from dataclasses import dataclass, replace
from typing import Any, Mapping

import numpy as np

from ..checkpoints.checkpoint import Checkpoint, load_checkpoint
from ..checkpoints.default_model import default_model_path
from ..checkpoints.tokenizer import Tokenizer
from ..config import EngineConfig
from ..errors import ModelLoadError
from ..heap import available_bytes
from ..kv.hybrid import with_recurrent_state
from ..kv.window import check_attention_window, with_declared_window
from ..models.config import ModelConfig
from ..pooling.task import resolve_task
from ..protocols import (
    Backend,
    Calibratable,
    ChoosesKVDtype,
    HoldsRecurrentState,
    KVCache,
    KVStorage,
    ModelExecutor,
    NarrowsDraftVocabulary,
    ProposesFromHiddenStates,
    Rewinding,
    SlidingWindow,
)
from ..quant.calibration import (
    calibration_token_lists,
    importance_key,
    load_importance,
    record_input_importance,
    save_importance,
)
from ..registry import Registry, load_registry
from ..sampling.params import SamplingParams
from .draft_vocabulary import draft_vocabulary
from .engine import Engine


@dataclass
class EngineParts:
    engine: Engine
    backend: Backend
    executor: ModelExecutor
    cache: KVCache
    tokenizer: Tokenizer
    checkpoint: Checkpoint
    model_config: ModelConfig
    engine_config: EngineConfig
    registry: Registry
    storage: KVStorage  # what the cache keeps its keys/values in; the memory plan reads its sizes
    kv_dtype_reason: str = "the weights' dtype"  # why engine_config.kv_dtype, for the start-up plan
    calibration: str = ""  # how int4 weighed its columns, for the start-up plan ("" without quantization)


def build_engine(
    model: str | None,
    backend: str = "torch",
    kv_cache: str = "paged",
    dtype: str = "float32",
    quant: str = "none",
    env: Mapping[str, str] | None = None,
    registry: Registry | None = None,
    calibrate: bool = True,
    task: str = "auto",
    **engine_options: Any,
) -> EngineParts:
    """With a quant other than "none" and ``calibrate``, the float model first reads the
    calibration text (qwen_serve.quant.calibration) if its backend can watch its projections.
    task: generate, embed or rerank; auto follows the checkpoint (qwen_serve.pooling.task). An
    embedding model is built without its language-model head."""
    # Resolve every name before loading weights, so a typo fails in milliseconds.
    registry = registry or load_registry(env)
    config = EngineConfig(**engine_options)
    cache_factory = registry.kv_cache_factory(kv_cache)
    proposer_factory = registry.proposer_factory(config.speculative) if config.speculative else None
    compute = registry.backend(backend)
    registry.kv_storage_entry(kv_cache, backend)
    kv_dtype, kv_dtype_reason = choose_kv_dtype(compute, dtype, config.kv_dtype)
    config = replace(config, kv_dtype=kv_dtype)
    checkpoint = load_checkpoint(model if model is not None else default_model_path())
    config = replace(with_declared_window(checkpoint.config, config), task=resolve_task(task, checkpoint.config))
    if config.task == "embed":
        checkpoint.config = replace(checkpoint.config, head=False)
    proposer = proposer_factory(config) if proposer_factory is not None else None
    if isinstance(proposer, ProposesFromHiddenStates):  # the model is built with its draft head
        proposer.check_model(checkpoint.config)
        checkpoint.config = replace(checkpoint.config, draft_layers=checkpoint.config.head_draft_layers)
    draft_ids = None
    if config.draft_vocab is not None:
        if not isinstance(proposer, ProposesFromHiddenStates):
            raise ModelLoadError(f"--draft-vocab narrows what a draft head guesses; the proposer "
                                 f"{config.speculative or '(none: --speculative is off)'} has none (--speculative mtp)")
        draft_ids = draft_vocabulary(config.draft_vocab, checkpoint.tokenizer, checkpoint.config.vocab_size)

    def new_storage(config: EngineConfig) -> KVStorage:  # the one the cache asks for (e.g. int8)
        return registry.create_kv_storage(kv_cache, compute, checkpoint.config, config.kv_dtype, config.block_size,
                                          config.slab_blocks, config.kv_blocks)

    def new_cache(storage: KVStorage, config: EngineConfig) -> KVCache:
        return with_state_if_needed(cache_factory(storage, config), compute, checkpoint.config, config)

    storage = new_storage(config)  # storage grows on first use: building it now costs nothing
    cache = new_cache(storage, config)
    check_attention_window(checkpoint.config, config, cache)
    importance, calibration = None, ""
    if quant != "none":
        calibration = "off (calibrate=False)" if not calibrate else \
            "not needed: the file's 4-bit blocks give every projection its int4 grid" if checkpoint.int4_blocks else \
            float_model_too_big(checkpoint.config, dtype)
    if quant != "none" and not calibration:
        importance = measure_importance(compute, checkpoint, dtype, new_cache, config, new_storage)
        calibration = "skipped: no calibration text fits, or the backend cannot watch its projections" \
            if importance is None else "by the activations of the calibration text"
        gc.collect()  # the float model may sit in reference cycles: free it before loading again
    if importance is None:
        executor = compute.load_model(checkpoint, dtype=dtype, quant=quant)
    else:
        executor = compute.load_model(checkpoint, dtype=dtype, quant=quant, importance=importance)
    if draft_ids is not None:
        if not isinstance(executor, NarrowsDraftVocabulary):
            raise ModelLoadError(f"the {compute.name} backend cannot narrow its draft head's vocabulary (--draft-vocab)")
        executor.narrow_draft_vocabulary(draft_ids.tolist())
    processors = [entry.factory(checkpoint.config, checkpoint.tokenizer) for entry in registry.logits_processors.values()]
    engine = Engine(executor, cache, compute.create_sampler(), checkpoint.tokenizer, config, processors, proposer)
    return EngineParts(engine, compute, executor, cache, checkpoint.tokenizer, checkpoint,
                       checkpoint.config, config, registry, storage, kv_dtype_reason, calibration)


def with_state_if_needed(cache: KVCache, compute: Backend, model_config: ModelConfig, config: EngineConfig) -> KVCache:
    """cache itself, or for a model with linear-attention layers cache wrapped to hold a
    recurrent state for each of the max_batch sequences a step may run, as many prefix-cache
    snapshots as state_cache_mib holds, and with speculative decoding num_speculative_tokens
    states per sequence to roll rejected drafts back to (kv.hybrid)."""
    if not model_config.linear_attention():
        return cache
    if not isinstance(compute, HoldsRecurrentState):
        raise ModelLoadError(f"the {compute.name} backend does not run linear-attention layers "
                             f"({model_config.architecture}) yet")
    if isinstance(cache, SlidingWindow):
        raise ValueError(f"{model_config.architecture} keeps a recurrent state beside its attention layers; "
                         "a sliding-window KV cache cannot serve it")
    per_state = sum(kind.state_bytes() for kind in model_config.linear_attention())
    snapshots = config.state_cache_mib * 2**20 // per_state if config.prefix_cache else 0
    drafts = config.num_speculative_tokens if config.speculative and isinstance(cache, Rewinding) else 0
    storage = compute.create_state_storage(model_config, config.max_batch * (1 + drafts) + snapshots)
    return with_recurrent_state(cache, storage, config.max_batch, snapshots, drafts)


def float_model_too_big(model_config: ModelConfig, dtype: str, headroom: float = 0.8) -> str:
    """Why calibration cannot run (it loads the float model), or "" when it can: the float
    weights must fit in `headroom` of the memory available now. Without calibration int4 weighs
    every column alike, the way llama.cpp quantizes without an imatrix."""
    available = available_bytes()
    needed = model_config.parameters() * (2 if dtype == "bfloat16" else 4)
    if available is None or needed <= headroom * available:
        return ""
    return (f"skipped: the {dtype} model ({needed / 2**30:,.1f} GiB) does not fit in the "
            f"{available / 2**30:,.1f} GiB available; every column weighs the same")


def choose_kv_dtype(compute: Backend, dtype: str, kv_dtype: str | None) -> tuple[str, str]:
    """The KV storage dtype and why: asked for by name, the weights' dtype (None), or under
    "auto" the backend's choice where it makes one."""
    if kv_dtype is None:
        return dtype, "the weights' dtype"
    if kv_dtype != "auto":
        return kv_dtype, "asked for"
    if isinstance(compute, ChoosesKVDtype):
        return compute.preferred_kv_dtype(dtype)
    return dtype, f"auto: the weights' dtype ({compute.name} makes no choice)"


def measure_importance(compute: Backend, checkpoint: Checkpoint, dtype: str, cache_factory: Any,
                       config: EngineConfig, new_storage: Any = None) -> dict[str, np.ndarray] | None:
    """Each projection's input importance: from the cache when this model, backend, dtype and
    text were measured before, else by loading the float model and running the calibration text
    through a throwaway engine (its KV storage grows only as far as the text needs; new_storage,
    config -> KVStorage, when the cache wants another than the backend's own). None when the
    backend's executor is not Calibratable or no token fits. The float weights are dropped
    before the caller loads the quantized ones.

    Measured on the decoder alone, as for the model without a draft head: calibration never runs
    the head, and this way both quantize the decoder from one cached measurement, so speculation
    keeps the same weights and greedy tokens. (Apart, each was measured when first asked for, and
    a measurement cached by an earlier version of the code differed from a fresh one by up to
    1.6e-5 relative: enough to move int4 codes.)"""
    with_head, checkpoint.config = checkpoint.config, replace(checkpoint.config, draft_layers=())
    try:
        return _measure_decoder_importance(compute, checkpoint, dtype, cache_factory, config, new_storage)
    finally:
        checkpoint.config = with_head


def _measure_decoder_importance(compute: Backend, checkpoint: Checkpoint, dtype: str, cache_factory: Any,
                                config: EngineConfig, new_storage: Any = None) -> dict[str, np.ndarray] | None:
    """measure_importance with checkpoint.config a decoder without draft layers."""
    # A small --max-seq-len or KV pool reads less of the text.
    token_lists = calibration_token_lists(checkpoint.tokenizer, config.resolved_max_seq_len(checkpoint.config) - 1)
    if not token_lists:
        return None
    key = importance_key(checkpoint.files(), checkpoint.config, compute.name, dtype, token_lists)
    importance = load_importance(key)
    if importance is not None:
        return importance
    executor = compute.load_model(checkpoint, dtype=dtype, quant="none")
    if not isinstance(executor, Calibratable):
        return None
    # No prefix cache: every calibration token passes through the projections. No speculation:
    # the calibration engine has no proposer (and the model no draft head, whose projections go
    # without importance).
    config = replace(config, prefix_cache=False, speculative=None)
    storage = new_storage(config) if new_storage is not None else compute.create_kv_storage(
        checkpoint.config, dtype, config.block_size, config.slab_blocks, config.kv_blocks)
    engine = Engine(executor, cache_factory(storage, config), compute.create_sampler(), checkpoint.tokenizer, config)
    if config.task == "generate":
        requests = [(f"calibration-{i}", tokens, SamplingParams(max_tokens=1, temperature=0.0))
                    for i, tokens in enumerate(token_lists)]
        importance = record_input_importance(executor, lambda: engine.run(requests))
    else:  # an embedding or reranking engine only prefills
        inputs = [(f"calibration-{i}", tokens) for i, tokens in enumerate(token_lists)]
        importance = record_input_importance(executor, lambda: engine.run_pooling(inputs))
    save_importance(key, importance)
    return importance
