"""The contracts between the framework-free core and compute backends.

Arrays appear as ``Any``: each backend passes its own tensor type through the core untouched.
Optional abilities of a KV cache are separate runtime-checkable Protocols, so the engine asks
``isinstance(cache, PrefixCaching)`` instead of probing attributes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Protocol, Sequence, runtime_checkable

from .models.config import ModelConfig
from .sampling.adjustment import BatchAdjustment, LogitsAdjustment
from .sampling.params import SamplingParams


@dataclass(frozen=True)
class KVUsage:
    """Block accounting of a KV cache at one moment (all counts in blocks)."""

    total: int
    used: int  # held by a sequence or by the prefix cache; used + free == total
    cached: int  # holding a published prefix hash (in use or evictable)
    prefix_hit_blocks: int = 0
    cow_copies: int = 0

    @property
    def free(self) -> int:
        return self.total - self.used


@runtime_checkable
class KVStorage(Protocol):
    """Backend memory for keys and values, addressed by slot = block_id * block_size + offset."""

    def ensure_blocks(self, num_blocks: int) -> None:
        """Make block ids < num_blocks addressable (storage grows in slabs, never per token)."""

    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None:
        """Store keys/values [n, kv_heads, head_dim] at the n given slots."""

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]:
        """Gather keys/values at an index array of slots (any shape), in one call."""

    def copy_block(self, src: int, dst: int) -> None:
        """Copy one block's keys/values in every layer (copy-on-write)."""

    def nbytes(self) -> int:
        """Bytes currently allocated."""

    def bytes_per_token(self) -> int:
        """Bytes one token's keys and values occupy in every layer, scales included (computed
        with qwen_serve.kv.memory), so memory figures follow the storage, not the dtype flag."""


@runtime_checkable
class KVCache(Protocol):
    """Where each sequence's keys and values live.

    The engine reserves room with ``allocate_slots`` and gives it back with ``free``; the model
    executor turns ``block_table`` into slots once per step and moves tensors with
    ``write``/``read``. A sequence's position p lives in slot
    ``block_table[p // block_size] * block_size + p % block_size``.
    """

    block_size: int

    def usage(self) -> KVUsage: ...

    def can_fit(self, num_tokens: int) -> bool:
        """Whether a lone sequence of num_tokens could ever be held (to reject, not to wait)."""

    def allocate_slots(self, seq_id: int, start: int, num_tokens: int, expected_total: int = 0) -> bool:
        """Make positions [start, start + num_tokens) writable; False changes nothing.

        expected_total is the longest the sequence may grow (prompt + max_tokens), a hint for
        caches that reserve up front.
        """

    def free(self, seq_id: int) -> None: ...

    def block_table(self, seq_id: int) -> Sequence[int]: ...

    def write(self, layer: int, slots: Any, keys: Any, values: Any) -> None: ...

    def read(self, layer: int, slots: Any) -> tuple[Any, Any]: ...


@runtime_checkable
class PrefixCaching(Protocol):
    """A cache that can serve a prompt's leading full blocks from earlier requests."""

    def match_prefix(self, seq_id: int, token_ids: Sequence[int]) -> int:
        """Attach cached blocks for the longest known prefix; returns tokens reused.

        Never covers the last token, so the model always computes at least one position.
        """

    def publish(self, seq_id: int, token_ids: Sequence[int], num_computed: int) -> None:
        """Make the full blocks among the first num_computed positions findable."""


@runtime_checkable
class Forking(Protocol):
    """A cache that can share a sequence's blocks with a new one (copy-on-write)."""

    def fork(self, parent_id: int, child_id: int) -> None: ...


@runtime_checkable
class Rewinding(Protocol):
    """A cache that can forget a sequence's last positions (speculative decoding's rejected
    drafts), giving back blocks that end up holding none of its positions. Only positions the
    engine never committed are rewound, so a block published to the prefix cache (always a
    full block of committed positions) is never altered; a cache without this runs without
    speculation."""

    def rewind(self, seq_id: int, num_tokens: int) -> None:
        """Keep positions [0, num_tokens) of seq_id; later ones are no longer held."""


@runtime_checkable
class SlidingWindow(Protocol):
    """A cache that keeps only each sequence's last ``window`` positions. A query at position q
    attends to keys at positions window_start(q) .. q, where window_start(q) =
    max(0, q - window + 1) (transformers' sliding-window mask); positions are absolute (RoPE is
    applied before the write), and block-table entries of blocks wholly before a sequence's
    window may be released (negative), so an executor gathers only positions inside it."""

    window: int

    def window_start(self, position: int) -> int: ...


@runtime_checkable
class LossyKV(Protocol):
    """A cache whose reads approximate what was written (quantized storage), so greedy tokens may
    drift from full precision. It names the exact cache with the same layout that it
    approximates; the conformance suite compares the two by logits instead of by tokens."""

    exact_counterpart: str  # registry name of that cache, e.g. "paged"


@runtime_checkable
class ReservesAhead(Protocol):
    """A cache that holds memory for a sequence's longest possible length up front, so its
    used blocks exceed the blocks its tokens fill (the cost paging removes)."""

    def reserved_tokens(self, seq_id: int) -> int: ...


@dataclass(frozen=True)
class ScheduledChunk:
    """Tokens of one sequence to run in a step: positions [start, start + len(token_ids))."""

    seq_id: int
    token_ids: Sequence[int]
    start: int
    sample: bool  # whether the last position's logits are wanted
    num_draft: int = 0  # the last num_draft tokens are proposals: with sample, logits of the last num_draft + 1 positions


@dataclass(frozen=True)
class StepBatch:
    """One model call: decode tokens and prefill chunks from several sequences."""

    chunks: tuple[ScheduledChunk, ...]

    @property
    def num_tokens(self) -> int:
        return sum(len(c.token_ids) for c in self.chunks)


@dataclass(frozen=True)
class SampleResult:
    token_ids: list[int]
    logprobs: list[dict[int, float] | None] = field(default_factory=list)


@runtime_checkable
class QuantizedLinear(Protocol):
    """y = x @ W.T for a weight stored in a compressed format."""

    in_features: int
    out_features: int

    def __call__(self, x: Any) -> Any: ...

    def dequantize(self) -> Any: ...

    def nbytes(self) -> int: ...


@runtime_checkable
class Sampler(Protocol):
    """Turns logits into tokens; each request draws from its own generator, seeded once.

    ``adjustment`` (only passed when some row has one) holds the logits processors' changes as
    numpy arrays; the sampler applies them to its own tensors first (penalties, biases, masks),
    greedy rows included, then temperature, top-k, softmax, top-p, min-p and the draw.
    Log-probabilities stay the model's own, before any of that.
    """

    def make_generator(self, seed: int) -> Any: ...

    def sample(
        self, logits: Any, params: Sequence[SamplingParams], generators: Sequence[Any],
        adjustment: BatchAdjustment | None = None,
    ) -> SampleResult: ...


class LogitsRequest(Protocol):
    """What a logits processor may read of a request (the engine's Sequence is one)."""

    prompt_token_ids: list[int]
    output_token_ids: list[int]
    params: SamplingParams


@runtime_checkable
class LogitsState(Protocol):
    """One request's (one choice's) state for one processor."""

    def adjust(self, request: LogitsRequest) -> LogitsAdjustment | None:
        """The change to the next token's logits; None changes nothing this step."""

    def accept(self, token_id: int) -> None:
        """Advance past a generated token (raise if the token breaks the state: the request fails)."""


@runtime_checkable
class Completing(Protocol):
    """A state that knows when nothing but EOS may follow (a grammar whose document is whole):
    the engine then ends the request with finish_reason "stop" (also under min_tokens or ignore_eos)."""

    def is_complete(self) -> bool: ...


@runtime_checkable
class LogitsProcessor(Protocol):
    """Restricts or biases next-token logits for the requests it chooses (penalties, logit_bias,
    a grammar's mask, or a plugin's own rule; hook ``register_logits_processors``).

    How it works: for every request (every choice of n) the engine calls ``start``; a processor
    that does not apply returns None and costs nothing more. Before each sampling step every live
    state returns a LogitsAdjustment of numpy arrays (token ids with penalty factors, token ids
    with additive biases, an allowed-token bitmask); the engine merges the batch's rows into one
    BatchAdjustment and the backend's sampler applies it to its own tensors, so torch and MLX
    share every processor. After each generated token every state of that request gets
    ``accept``. State follows the request's tokens, never the KV cache, so preemption and
    recomputation leave it right. The stages run in a fixed order whatever order
    processors register in: penalties, biases, masks, then temperature and the filters.
    """

    def validate(self, params: SamplingParams) -> None:
        """Raise InvalidRequest, naming the part, when params ask this processor for something it
        cannot do (e.g. a schema it cannot compile). Called from any thread; changes nothing."""

    def start(self, request: LogitsRequest) -> LogitsState | None:
        """The request's state, or None when this processor does not apply to it."""


@runtime_checkable
class TakesRequestArgs(Protocol):
    """A logits processor that a request steers with arguments of its own: the request names them
    in SamplingParams.extra_args (HTTP ``vllm_xargs``), and the processor reads them in ``start``
    with ``request.params.request_args(self.request_arg_keys)``. The engine refuses a request
    carrying a name no processor claims; each name is claimed by one processor at most."""

    request_arg_keys: tuple[str, ...]

    def check_request_args(self, args: dict[str, Any]) -> None:
        """Raise InvalidRequest with param "vllm_xargs" when a value is wrong. args holds the
        claimed names the request carries (at least one). Called from any thread; changes nothing."""


@runtime_checkable
class ModelExecutor(Protocol):
    """Owns the weights; runs one batched forward over a StepBatch."""

    config: ModelConfig

    def weight_bytes(self) -> int: ...

    def execute(self, batch: StepBatch, cache: KVCache) -> Any:
        """Logits [sum of 1 + num_draft over chunks with sample=True, vocab], in chunk order (a
        chunk with drafts gives its last num_draft + 1 rows, in position order)."""


@runtime_checkable
class ChoosesKVDtype(Protocol):
    """A backend that knows which KV storage dtype serves best on this machine; the server's
    default ``--kv-dtype auto`` follows it (other backends keep the weights' dtype)."""

    def preferred_kv_dtype(self, dtype: str) -> tuple[str, str]:
        """(the KV dtype for weights of ``dtype``, why, in a few words for the start-up plan)."""


@runtime_checkable
class ChoosesKernels(Protocol):
    """An executor that chose among compute paths by timing them on this CPU: the start-up plan
    and ``qwen-serve bench --kernels`` print the table it chose from."""

    def kernel_table(self) -> list[str]:
        """Lines of text: each shape's paths, their timings and the choice (none: nothing chosen)."""


@runtime_checkable
class Calibratable(Protocol):
    """An executor whose projections can be watched while it runs, so int4 quantization can
    weigh each input column by the activations it meets (qwen_serve.quant.calibration)."""

    def projections(self) -> Iterable[tuple[str, Any, str]]:
        """(checkpoint weight name, object holding the layer, attribute name) of every linear
        layer that int4 quantizes. Names may share one layer (projections merged into one
        matmul read the same input): each gets that layer's input statistics."""

    def to_numpy(self, x: Any) -> Any:
        """A layer input as a numpy array."""


@runtime_checkable
class Backend(Protocol):
    """A compute path: builds executors, KV storage and samplers for one array library."""

    name: str
    quantizations: tuple[str, ...]  # what load_model's quant accepts, e.g. ("none", "int4")
    # Optional: ``serial_compute`` (a reason string) when, on this machine, the backend multiplies
    # a batch of rows no faster than the rows one by one; the conformance suite reads it.

    def load_model(self, checkpoint: Any, dtype: str, quant: str) -> ModelExecutor:
        """A backend whose float executor is Calibratable also takes ``importance`` (checkpoint
        weight name -> per-input-column weights) and passes it to int4.quantize."""

    def create_kv_storage(
        self, config: ModelConfig, dtype: str, block_size: int, slab_blocks: int, max_blocks: int
    ) -> KVStorage: ...

    def create_sampler(self) -> Sampler: ...


# Speculation: proposing tokens, and a sampler verifying sampled drafts (a cache rolling back
# rejected positions is Rewinding, above).
@runtime_checkable
class Proposer(Protocol):
    """Guesses tokens likely to follow a context, cheaply (hook ``register_proposers``).

    The engine runs the guesses as extra positions of the sequence's chunk and keeps only what
    verification accepts, so a bad guess costs compute, never correctness.
    """

    def propose(self, token_ids: Sequence[int], max_tokens: int) -> list[int]:
        """At most max_tokens tokens to try after token_ids (prompt + output); [] for none."""


@runtime_checkable
class DraftVerifying(Protocol):
    """A sampler that verifies a sampled request's drafts by rejection sampling, so what it emits
    is distributed exactly as normal decoding. Greedy drafts need no such ability (any sampler's
    argmax verifies them); a sampler without it runs sampled requests without speculation."""

    def verify_draft(self, logits: Any, params: SamplingParams, generator: Any, draft: Sequence[int]) -> list[int]:
        """logits [len(draft) + 1, vocab]: row i scores the token after draft[:i]. Returns the
        accepted prefix of draft plus one token drawn from the target: the draft is a point
        mass q, so draft[i] is kept with probability p(draft[i]); on the first rejection one
        token is drawn from p with draft[i] removed (renormalized) and verification stops; if
        all are kept, one token is drawn from the last row. Draws come from the request's own
        generator, so a seeded request replays the same tokens."""
