"""The contracts between the framework-free core and compute backends, one file per concern
(kv, state, batch, logits, backend, speculative), every name importable from here.

Arrays appear as ``Any``: each backend passes its own tensor type through the core untouched.
Optional abilities (of a KV cache, a backend, a logits processor) are separate
runtime-checkable Protocols, so the engine asks ``isinstance(cache, PrefixCaching)`` instead of
probing attributes.
"""
from .backend import (
    Backend,
    Calibratable,
    ChoosesKernels,
    ChoosesKVDtype,
    ModelExecutor,
    Pools,
    QuantizedLinear,
    ReadsRoutedExperts,
    Sampler,
)
from .batch import SampleResult, ScheduledChunk, StepBatch
from .kv import (
    BlockMap,
    DescribesBlocks,
    Forking,
    KVCache,
    KVStorage,
    KVUsage,
    LossyKV,
    PrefixCaching,
    ReservesAhead,
    Rewinding,
    SlidingWindow,
)
from .logits import Completing, LogitsProcessor, LogitsRequest, LogitsState, TakesRequestArgs
from .speculative import (
    DraftHead,
    DraftRequest,
    DraftVerifying,
    NarrowsDraftVocabulary,
    Proposer,
    ProposesFromHiddenStates,
)
from .state import HoldsRecurrentState, RecurrentState, StateStorage

__all__ = [
    "BlockMap", "DescribesBlocks", "Backend", "Calibratable", "ChoosesKVDtype", "ChoosesKernels", "ReadsRoutedExperts", "Completing", "DraftHead", "DraftRequest", "DraftVerifying", "Forking", "HoldsRecurrentState",
    "KVCache", "KVStorage", "KVUsage", "LogitsProcessor", "LogitsRequest", "LogitsState", "LossyKV",
    "ModelExecutor", "NarrowsDraftVocabulary", "Pools", "PrefixCaching", "Proposer", "ProposesFromHiddenStates", "QuantizedLinear", "RecurrentState", "ReservesAhead", "Rewinding", "SampleResult",
    "Sampler", "ScheduledChunk", "SlidingWindow", "StateStorage", "StepBatch", "TakesRequestArgs",
]
