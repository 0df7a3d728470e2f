"""The chunked gated delta rule of a prefill (delta_rule.chunked) on this CPU: ms per layer for a
chunk of tokens, by block length, with each block's triangular solve in LAPACK (through torch) or
in the C++ kernel, with and without the prefix cache's state snapshot every 16 tokens. Not run by CI.

    flock /work/cpu.lock python benchmarks/bench_delta_rule.py
    python benchmarks/bench_delta_rule.py --heads 16 --tokens 512 --blocks 16,32,64
    python benchmarks/bench_delta_rule.py --model CHECKPOINT --dtype bfloat16 --quant none --lengths 512,1600

Qwen3.5-0.8B's and -2B's linear-attention heads by default (16 value heads of 128 x 128, float32
state); the inputs are random (normalized q and k, decays below 1). The two solves take turns,
best of --repeats for each, so a spell of slow memory falls on both.

With --model (a Qwen3.5 checkpoint, e.g. the one bench_hybrid.py makes): one prompt of distinct
random tokens per length prefilled to its first token in one process (the engine's steps, as
prefill.py times them), the layers' solve switched between the two in turns, best of 3 each.
"""
from __future__ import annotations

import argparse
import time

import torch

from qwen_serve.bench.machine import machine_header

PREFILL_REPEATS = 3

SNAPSHOT_EVERY = 16  # the default KV block: the prefix cache keeps a state at each block boundary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--heads", type=int, default=16)
    parser.add_argument("--key-dim", type=int, default=128)
    parser.add_argument("--value-dim", type=int, default=128)
    parser.add_argument("--tokens", type=int, default=512, help="one prefill chunk")
    parser.add_argument("--blocks", default="16,32,64,128")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--model", help="a Qwen3.5 checkpoint: time whole prefills instead")
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quant", default="none")
    parser.add_argument("--lengths", default="512,1600", help="with --model: prompt lengths in tokens")
    args = parser.parse_args()
    if args.model:
        prefill_in_turns(args.model, args.dtype, args.quant, [int(n) for n in args.lengths.split(",")])
        return

    from qwen_serve.backends.torch_cpu import delta_rule
    from qwen_serve.backends.torch_cpu.gated_deltanet import kernel_solve
    from qwen_serve.backends.torch_cpu.native import load_kernels

    print(machine_header(), flush=True)
    kernels = load_kernels()
    solves = {"LAPACK": delta_rule.solve_in_torch}
    if kernels is not None:
        solves["C++"] = kernel_solve(kernels.ops)
    generator = torch.Generator().manual_seed(0)
    T, H = args.tokens, args.heads
    q, k = (torch.nn.functional.normalize(torch.randn(T, H, args.key_dim, generator=generator), dim=-1)
            for _ in range(2))
    v = torch.randn(T, H, args.value_dim, generator=generator)
    g, beta = -torch.rand(T, H, generator=generator), torch.rand(T, H, generator=generator)
    kept = torch.empty(T // SNAPSHOT_EVERY, H, args.key_dim, args.value_dim)
    every_block = [(SNAPSHOT_EVERY * (i + 1), into) for i, into in enumerate(kept)]
    print(f"{T} tokens, {H} heads of {args.key_dim} x {args.value_dim}, {torch.get_num_threads()} threads; "
          f"ms per layer, best of {args.repeats}")
    print(f"{'block':>6s}{'snapshots':>11s}" + "".join(f"{name:>10s}" for name in solves))
    with torch.inference_mode():
        for block in (int(b) for b in args.blocks.split(",")):
            for label, snapshots in (("none", []), (f"every {SNAPSHOT_EVERY}", every_block)):
                best = {name: float("inf") for name in solves}
                for turn in range(args.repeats):
                    for name in (list(solves) if turn % 2 == 0 else list(solves)[::-1]):
                        state = torch.zeros(H, args.key_dim, args.value_dim)
                        started = time.perf_counter()
                        delta_rule.chunked(state, q, k, v, g, beta, block, snapshots, solves[name])
                        best[name] = min(best[name], time.perf_counter() - started)
                print(f"{block:6d}{label:>11s}" + "".join(f"{best[name] * 1e3:10.1f}" for name in solves), flush=True)


def prefill_in_turns(model: str, dtype: str, quant: str, lengths: list[int]) -> None:
    import numpy as np
    from engine_timing import timed_run

    from qwen_serve import LLM
    from qwen_serve.backends.torch_cpu import delta_rule, gated_deltanet

    print(machine_header(), flush=True)
    llm = LLM(model, dtype=dtype, quant=quant, kv_blocks=2048, max_batch=16)
    print("delta rule blocks:", {geometry: block for geometry, (block, _) in llm.parts.executor.delta_blocks.items()})
    in_kernel = gated_deltanet.kernel_solve
    solvers = {"C++": in_kernel, "LAPACK": lambda kernels: delta_rule.solve_in_torch}
    rng = np.random.default_rng(0)

    def ttft(n: int) -> float:
        return timed_run(llm.engine, [rng.integers(100, 30000, size=n).tolist()], 1)[0]

    ttft(32)  # warm-up
    print(f"{model} ({dtype}, quant {quant}): prefill to the first token, ms, best of {PREFILL_REPEATS}")
    for n in lengths:
        seconds: dict[str, list[float]] = {name: [] for name in solvers}
        for turn in range(PREFILL_REPEATS):
            for name in (list(solvers) if turn % 2 == 0 else list(solvers)[::-1]):
                gated_deltanet.kernel_solve = solvers[name]  # what chunk_in_kernel calls, per chunk
                seconds[name].append(ttft(n))
        gated_deltanet.kernel_solve = in_kernel
        print(f"{n:6d} tokens: " + "  ".join(
            f"{name} {min(s) * 1e3:7.0f} ({n / min(s):5.1f} tok/s; all {', '.join(f'{t * 1e3:.0f}' for t in s)})"
            for name, s in seconds.items()), flush=True)


if __name__ == "__main__":
    main()
