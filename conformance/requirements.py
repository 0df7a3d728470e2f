"""What each check needs, declared once. An implementation lacking it is skipped (or, for a
difference shown on purpose, xfailed) with the reason here, never by scattered ifs in checks.

Abilities are read from the runtime-checkable Protocols an object implements and from what a
backend declares (``Backend.quantizations``), so a third-party plugin needs no entry here.
"""
from __future__ import annotations

from typing import Any

from qwen_serve.protocols import PrefixCaching, ReservesAhead


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
