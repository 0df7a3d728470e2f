"""One mixture-of-experts layer of Qwen3-30B-A3B's geometry (128 experts of 768 over hidden 2048,
8 routed per token) in int4, its experts run one by one from Python (decoder_layer's grouped
path) against all in one C++ call (fused_experts.py), in turns, at 1 to 16 tokens.

    flock /work/cpu.lock python benchmarks/bench_experts.py

The experts are random int4 codes (their values do not change the time) in the model's own
classes; routing is uniformly random, seeded. Per row count: the distinct experts a step runs
(the mean over the timed steps), the bytes those experts' weights take (what a step must read)
and the time per layer call of each path (median of the turns), and the read rate that implies
beside the machine's measured bandwidth. Not run by CI.
"""
from __future__ import annotations

import argparse
import statistics
import time

import numpy as np
import torch

from qwen_serve.backends.torch_cpu.decoder_layer import LayerWeights, SparseMoELayer, run_experts_grouped
from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear
from qwen_serve.backends.torch_cpu.layer_ops import LayerOps
from qwen_serve.backends.torch_cpu.native import load_kernels
from qwen_serve.bench.machine import describe_machine, machine_header
from qwen_serve.models.layers import SparseMoE
from qwen_serve.models.weights import TensorsByName
from qwen_serve.quant.int4 import GROUP, Int4Weight

HIDDEN, INTERMEDIATE, EXPERTS, TOP_K = 2048, 768, 128, 8
ROWS = (1, 2, 4, 8, 16)


def random_int4(rng: np.random.Generator, rows: int, cols: int) -> Int4Linear:
    scale = np.full((rows, cols // GROUP), 0.002, dtype=np.float16)
    packed = rng.integers(0, 256, (rows, cols // 2), dtype=np.uint8)
    return Int4Linear(Int4Weight(packed, scale, (-8 * scale).astype(np.float16)))


def build_layer(rng: np.random.Generator) -> SparseMoELayer:
    kind = SparseMoE(EXPERTS, TOP_K, INTERMEDIATE, True)
    tensors = {"layer.mlp.gate.weight": torch.randn(EXPERTS, HIDDEN)}
    for e in range(EXPERTS):
        prefix = f"layer.mlp.experts.{e}"
        tensors[f"{prefix}.gate_proj.weight"] = random_int4(rng, INTERMEDIATE, HIDDEN)
        tensors[f"{prefix}.up_proj.weight"] = random_int4(rng, INTERMEDIATE, HIDDEN)
        tensors[f"{prefix}.down_proj.weight"] = random_int4(rng, HIDDEN, INTERMEDIATE)
    return SparseMoELayer(kind, LayerWeights(TensorsByName(tensors), "layer", lambda weight, bias: weight))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--turns", type=int, default=15)
    parser.add_argument("--steps", type=int, default=20, help="layer calls per turn and path")
    args = parser.parse_args()
    torch.set_num_threads(2)
    machine = describe_machine()
    print(machine_header(machine))
    if load_kernels() is None:
        raise SystemExit("no kernels on this machine")
    rng = np.random.default_rng(0)
    layer = build_layer(rng)
    fused, ops = layer.fused, LayerOps(load_kernels())
    if fused is None:
        raise SystemExit("the fused expert kernel needs AVX-512 VNNI, which this CPU lacks")
    expert_bytes = sum(linear.nbytes() for linear in layer.experts[0].linears())
    bandwidth = machine["memory_bandwidth"]["read_gb_s"]
    print(f"one expert: {expert_bytes / 2**20:.2f} MiB; read bandwidth {bandwidth} GB/s")
    print(f"{'rows':>4} {'experts':>8} {'MiB read':>9} {'per expert ms':>14} {'fused ms':>9} {'speed-up':>9} "
          f"{'fused GB/s':>11}")
    for rows in ROWS:
        x = torch.randn(rows, HIDDEN)
        routes = [torch.from_numpy(np.stack([rng.choice(EXPERTS, TOP_K, replace=False) for _ in range(rows)]))
                  for _ in range(args.steps)]
        weights = torch.full((rows, TOP_K), 1.0 / TOP_K)
        times = {"grouped": [], "fused": []}
        for _ in range(args.turns):
            for path in times:
                start = time.perf_counter()
                for chosen in routes:
                    if path == "fused":
                        fused(x, weights, chosen)
                    else:
                        run_experts_grouped(layer.experts, x, weights, chosen, ops)
                times[path].append((time.perf_counter() - start) / len(routes))
        distinct = statistics.mean(len(torch.unique(chosen)) for chosen in routes)
        grouped_s, fused_s = (statistics.median(times[p]) for p in ("grouped", "fused"))
        read = distinct * expert_bytes
        print(f"{rows:>4} {distinct:>8.1f} {read / 2**20:>9.1f} {grouped_s * 1e3:>14.2f} {fused_s * 1e3:>9.2f} "
              f"{grouped_s / fused_s:>8.2f}x {read / fused_s / 1e9:>11.1f}")


if __name__ == "__main__":
    main()
