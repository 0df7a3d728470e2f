"""What each check needs, declared once. An implementation lacking it is skipped (or, for a
difference shown on purpose, xfailed) with the reason here, never by scattered ifs in checks.

Abilities are read from the runtime-checkable Protocols an object implements and from what a
backend declares (``Backend.quantizations``), so a third-party plugin needs no entry here.
"""
from __future__ import annotations

from typing import Any

from qwen_serve.protocols import HoldsRecurrentState, LossyKV, PrefixCaching, ReservesAhead, SlidingWindow

# A sliding-window cache runs every check with this window (tokens): shorter than check 2's long
# prompts (> 128 tokens), so the window binds there and in a decode past it.
CONFORMANCE_WINDOW = 64


def lacks_prefix_sharing(cache: Any) -> str | None:
    if not isinstance(cache, PrefixCaching):
        return f"{type(cache).__name__} does not share prefixes (no PrefixCaching)"
    return None


def reserves_ahead(cache: Any) -> str | None:
    if isinstance(cache, ReservesAhead):
        return f"{type(cache).__name__} reserves each sequence's longest possible length up front (ReservesAhead)"
    return None


def lacks_quantization(backend: Any, quant: str) -> str | None:
    if quant not in backend.quantizations:
        return f"backend {backend.name!r} offers quantizations {', '.join(backend.quantizations)}, not {quant}"
    return None


def computes_serially(backend: Any) -> str | None:
    """A backend declares ``serial_compute`` (the reason, or None) when on this machine its array
    library multiplies a batch of rows no faster than the rows one by one, so batching cannot
    speed it up (check 3)."""
    return getattr(backend, "serial_compute", None)


def engine_options_for(cache: Any) -> dict[str, Any]:
    """Engine options a cache needs to run the checks, read from an instance: a SlidingWindow
    cache gets the suite's window."""
    return {"kv_window": CONFORMANCE_WINDOW} if isinstance(cache, SlidingWindow) else {}


def lossy(cache: Any) -> str | None:
    """A LossyKV cache cannot promise transformers' greedy tokens (check 2): it is compared with the
    exact cache it approximates, by top-1 agreement and the largest logit difference."""
    if isinstance(cache, LossyKV):
        return (f"{type(cache).__name__} stores keys/values approximately (LossyKV): compared with the "
                f"{cache.exact_counterpart!r} cache by logits")
    return None


def window_of(cache: Any) -> int | None:
    return cache.window if isinstance(cache, SlidingWindow) else None


def no_windowed_reference(cache: Any, model: str) -> str | None:
    """transformers has sliding-window attention for Qwen3 and Qwen3-MoE but not for Llama
    (SmolLM2), so a windowed cache takes check 2 against the windowed random checkpoints only."""
    if isinstance(cache, SlidingWindow) and model == "smollm2":
        return (f"{type(cache).__name__} attends over the last {cache.window} positions only (SlidingWindow); "
                f"transformers' Llama has no sliding-window attention to compare SmolLM2 with")
    return None


def is_hybrid(model: str) -> bool:
    """The suite's hybrid checkpoints (linear attention beside attention) by fixture name."""
    return model.startswith("random_qwen3_5")


def cannot_serve(backend: Any, cache: Any, model: str) -> str | None:
    """A hybrid model needs a backend that holds recurrent states (HoldsRecurrentState) and a
    cache that keeps every position: its linear-attention state holds the whole prefix, and its
    attention layers have no windowed form."""
    if not is_hybrid(model):
        return None
    if not isinstance(backend, HoldsRecurrentState):
        return f"backend {backend.name!r} does not run linear-attention layers (no HoldsRecurrentState)"
    if isinstance(cache, SlidingWindow):
        return (f"{type(cache).__name__} keeps only a window (SlidingWindow), and a hybrid model's "
                f"linear-attention state holds the whole prefix")
    return None


def holds_only_a_window(cache: Any) -> str | None:
    """Check 5 expects every token's block to stay; a window cache gives back those behind it."""
    if isinstance(cache, SlidingWindow):
        return (f"{type(cache).__name__} keeps only each sequence's last {cache.window} positions (SlidingWindow): "
                f"blocks behind the window go back to the pool")
    return None


def amplifies_batch_variance(cache: Any) -> str | None:
    """Check 1 through HTTP: requests join a running batch at any step, so a request's rows are
    multiplied beside other row counts than when it ran alone, and float matmuls round with the
    row count (oneDNN's float32 linear: |diff| up to 5e-5 on a 576-wide layer between 1 row and
    more). The float caches keep that far below what a sampled token notices; a LossyKV cache
    rounds keys and values to a grid, where such a difference can move a value one step and
    change a later draw. Same-schedule determinism (the offline part of check 1) still holds."""
    if isinstance(cache, LossyKV):
        return (f"{type(cache).__name__} rounds keys/values (LossyKV), which can turn the matmuls' "
                f"row-count rounding into a different draw under concurrency")


def cannot_speculate(cache: Any, sampler: Any) -> str | None:
    """Check 7 needs a cache that rolls rejected drafts back and a sampler that verifies sampled
    drafts by rejection sampling; without either the engine decodes sampled requests normally."""
    from qwen_serve.protocols import DraftVerifying, Rewinding

    if not isinstance(cache, Rewinding):
        return f"{type(cache).__name__} cannot roll back rejected drafts (no Rewinding): it runs without speculation"
    if not isinstance(sampler, DraftVerifying):
        return (f"{type(sampler).__name__} cannot verify sampled drafts (no DraftVerifying): sampled requests "
                f"run without speculation")
    return None


def routes_discretely(model: str) -> str | None:
    """A lossy cache is held to the exact one's logits; on a mixture of experts its rounding can
    move a token to another expert, a jump no bound on small differences allows."""
    if "moe" in model:
        return ("a mixture of experts picks each token's experts by top-k, so the cache's rounding moves some "
                "tokens to other experts and their logits jump")
    return None

