"""How many tokens the chunked gated delta rule (delta_rule.chunked) takes per block, chosen by
timing on this CPU.

A block costs a few products of [heads, block, block] and [heads, block, key_dim] matrices, a
triangular solve, and one pass over the [heads, key_dim, value_dim] state; longer blocks make
fewer passes over the state and more work per token, and where those cross depends on the CPU's
caches and GEMM. On 2 Zen 3 cores (AVX2) 512 tokens of 16 heads x 128 x 128, with a prefix-cache
snapshot every 16 tokens, took 31 ms in 32-token blocks, 40 in 64 and 70 in 128. So the first load
on a machine times each candidate on the model's head geometry and keeps the timings with the
projections' (kernel_choice.py), under the same key of the CPU, the kernels' build and the threads.
"""
from __future__ import annotations

import time

import torch

from . import delta_rule
from .gated_deltanet import GatedDeltaNetLayer, kernel_solve
from .kernel_choice import choices_file, read_timings, write_timings

CANDIDATES = (16, 32, 64, 128)
TIMED_TOKENS = 256
SNAPSHOT_EVERY = 16  # the default KV block: with prefix caching on, a state is kept at each block boundary
REPEATS = 3
PATHS = {False: "chunked", True: "chunked, C++ solve"}  # by whether the C++ kernels run: the timings differ


def shape_key(heads: int, key_dim: int, value_dim: int) -> str:
    return f"delta_rule {heads}x{key_dim}x{value_dim}"


def choose_block(heads: int, key_dim: int, value_dim: int, kernels=None) -> tuple[int, dict[int, float]]:
    """(the fastest block, seconds per candidate) for this head geometry, measured once per machine
    with the triangular solve the layers use (kernels: torch.ops.qwen_serve, or None)."""
    path, key, name = choices_file(), shape_key(heads, key_dim, value_dim), PATHS[kernels is not None]
    stored = read_timings(path)
    seconds = stored.get(key, {}).get(name)
    if seconds is None or set(seconds) != set(CANDIDATES):
        solve = delta_rule.solve_in_torch if kernels is None else kernel_solve(kernels)
        seconds = {block: _time(block, heads, key_dim, value_dim, solve) for block in CANDIDATES}
        stored.setdefault(key, {})[name] = seconds
        write_timings(path, stored)
    return min(seconds, key=seconds.get), seconds


def describe(heads: int, key_dim: int, value_dim: int, seconds: dict[int, float], chosen: int) -> str:
    cells = "  ".join(f"{block}: {t * 1e3:.1f}{'*' if block == chosen else ''}" for block, t in sorted(seconds.items()))
    return f"{shape_key(heads, key_dim, value_dim)}, ms for {TIMED_TOKENS} tokens by block: {cells}"


@torch.inference_mode()
def _time(block: int, heads: int, key_dim: int, value_dim: int, solve: delta_rule.Solve) -> float:
    generator = torch.Generator().manual_seed(0)
    q, k = (torch.nn.functional.normalize(torch.randn(TIMED_TOKENS, heads, key_dim, generator=generator), dim=-1)
            for _ in range(2))
    v = torch.randn(TIMED_TOKENS, heads, value_dim, generator=generator)
    g, beta = -torch.rand(TIMED_TOKENS, heads, generator=generator), torch.rand(TIMED_TOKENS, heads, generator=generator)
    kept = torch.empty(TIMED_TOKENS // SNAPSHOT_EVERY, heads, key_dim, value_dim)
    snapshots = [(SNAPSHOT_EVERY * (i + 1), into) for i, into in enumerate(kept)]
    best = float("inf")
    for _ in range(REPEATS):
        state = torch.zeros(heads, key_dim, value_dim)
        started = time.perf_counter()
        delta_rule.chunked(state, q, k, v, g, beta, block, snapshots, solve)
        best = min(best, time.perf_counter() - started)
    return best


def choose_delta_blocks(layers, kernels=None) -> dict[tuple[int, int, int], tuple[int, dict[int, float]]]:
    """Set the block of every Gated DeltaNet layer among the decoder layers `layers` (kernels: the
    Kernels loaded, or None); returns
    {(value heads, key_dim, value_dim): (block, seconds per candidate)}."""
    chosen: dict[tuple[int, int, int], tuple[int, dict[int, float]]] = {}
    for layer in layers:
        if isinstance(layer.mixer, GatedDeltaNetLayer):
            kind = layer.mixer.kind
            geometry = (kind.num_value_heads, kind.key_dim, kind.value_dim)
            if geometry not in chosen:
                chosen[geometry] = choose_block(*geometry, None if kernels is None else kernels.ops)
            layer.mixer.block = chosen[geometry][0]
    return chosen
