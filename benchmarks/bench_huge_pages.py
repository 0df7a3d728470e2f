"""Decode steps with the weights in 2 MiB pages (as loaded, huge_pages.py) against a copy of the
same weights in ordinary 4 KiB pages, in one process, taking turns.

    flock /work/cpu.lock python benchmarks/bench_huge_pages.py --qwen-dir /tmp/qwen3-0.6b
    ... --dtype bfloat16 --quant none --batch 8

The engine decodes with one copy for a turn of 10 steps, then with the other (who goes first
alternates), 40 turns each: on a machine whose speed drifts by the minute the two figures are
then measured seconds apart. Prints and writes (benchmarks/results/DATE-huge-pages/huge_pages-*.json) the median
and best ms per step of each, with the CPU and the pages the process holds.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from result_folder import result_folder

STEPS_PER_TURN = 10


def anon_huge_mib() -> int:
    for line in open("/proc/self/smaps_rollup"):
        if line.startswith("AnonHugePages:"):
            return int(line.split()[1]) // 1024
    return 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen-dir", type=Path, required=True)
    parser.add_argument("--dtype", default="bfloat16")
    parser.add_argument("--quant", default="int4")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--turns", type=int, default=40)
    args = parser.parse_args()

    from qwen_serve import LLM, SamplingParams
    from qwen_serve.backends.torch_cpu.huge_pages import ALIGN, advised_pieces
    from qwen_serve.bench.machine import describe_machine, machine_header

    machine = describe_machine(measure_bandwidth=False)
    print(machine_header(machine))

    llm = LLM(str(args.qwen_dir), dtype=args.dtype, quant=args.quant, max_batch=max(8, args.batch))
    engine, model = llm.engine, llm.engine.executor
    layers = model.linears()
    huge = {(id(lin), name): getattr(lin, name) for lin in layers for name in lin.streamed_tensors()
            if getattr(lin, name) is not None}
    # the copy in a mapping advised to stay in 4 KiB pages (torch's heap may hold numpy's advice)
    pieces = advised_pieces([t.numel() * t.element_size() for t in huge.values()], ALIGN, "the plain copy", huge=False)
    if pieces is None:
        raise SystemExit("this system cannot map memory advised MADV_NOHUGEPAGE")
    plain = {key: piece.view(t.dtype).view(t.shape).copy_(t) for (key, t), piece in zip(huge.items(), pieces)}
    by_id = {id(lin): lin for lin in layers}

    def use(copy: dict) -> None:
        for (layer_id, name), t in copy.items():
            setattr(by_id[layer_id], name, t)
        if model.fused is not None:  # it holds the projections' tensors in a list of its own
            model.fused = type(model.fused)(model.layers, model.fused.kernels)

    rng = np.random.default_rng(0)
    tokens = args.turns * 2 * STEPS_PER_TURN + 16
    params = SamplingParams(max_tokens=tokens, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(f"r{i}", rng.integers(100, 30000, size=64).tolist(), params)
    for _ in range(5):
        engine.step()
    times: dict[str, list[float]] = {"huge": [], "plain": []}
    for turn in range(args.turns):
        for name in ("huge", "plain") if turn % 2 == 0 else ("plain", "huge"):
            use(huge if name == "huge" else plain)
            start = time.perf_counter()
            for _ in range(STEPS_PER_TURN):
                engine.step()
            times[name].append((time.perf_counter() - start) / STEPS_PER_TURN * 1e3)
    result = {"dtype": args.dtype, "quant": args.quant, "batch": args.batch, "turns": args.turns,
              "weights_mib": round(sum(t.numel() * t.element_size() for t in huge.values()) / 2**20, 1),
              "anon_huge_pages_mib": anon_huge_mib(), "machine": machine}
    for name, values in times.items():
        result[f"{name}_ms_median"] = round(float(np.median(values)), 2)
        result[f"{name}_ms_best"] = round(min(values), 2)
    print(json.dumps(result))
    path = result_folder("huge-pages") / f"huge_pages-{args.quant}-{args.dtype}-b{args.batch}.json"
    path.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
