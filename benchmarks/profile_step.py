"""Where one decode step's time goes: torch's profiler over engine steps of the Qwen3-0.6B geometry.

    python benchmarks/profile_step.py --qwen-dir /tmp/qwen3-0.6b --quant int4 --batch 1
    py-spy record -o step.svg -- python benchmarks/profile_step.py --qwen-dir ... --steps 200 --no-profiler

Prints the ops with the most self CPU time, and the wall time of a step split into the model's
forward (execute) and the rest of the engine step (scheduling, sampling, detokenizing).
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen-dir", type=Path, required=True)
    parser.add_argument("--quant", default="int4")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-dtype", default="auto", help="as the server's --kv-dtype (default auto, as it starts)")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--no-profiler", action="store_true")
    args = parser.parse_args()

    import torch

    from qwen_serve import LLM, SamplingParams
    from qwen_serve.bench.machine import machine_header

    print(machine_header())

    llm = LLM(str(args.qwen_dir), dtype=args.dtype, quant=args.quant, max_batch=max(8, args.batch),
              kv_blocks=max(1024, args.batch * (args.context // 16 + 8)), kv_dtype=args.kv_dtype)
    engine = llm.engine
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=args.steps + 6, ignore_eos=True)
    for i in range(args.batch):
        engine.add_request(f"p{i}", rng.integers(100, 30000, size=args.context).tolist(), params)
    while any(s.num_computed < len(s.prompt_token_ids) for s in engine.scheduler.running + list(engine.scheduler.waiting)):
        engine.step()
    for _ in range(3):
        engine.step()  # warm-up decode steps

    execute = engine.executor.execute
    spent = {"execute": 0.0}

    def timed_execute(batch, cache):
        t = time.perf_counter()
        out = execute(batch, cache)
        spent["execute"] += time.perf_counter() - t
        return out

    engine.executor.execute = timed_execute
    t = time.perf_counter()
    if args.no_profiler:
        for _ in range(args.steps):
            engine.step()
    else:
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                engine.step()
    wall = time.perf_counter() - t
    print(f"{args.quant}/{args.dtype} KV {engine.config.kv_dtype} batch {args.batch} context {args.context}: {wall / args.steps * 1e3:.2f} ms per step, "
          f"execute {spent['execute'] / args.steps * 1e3:.2f} ms, rest of the step "
          f"{(wall - spent['execute']) / args.steps * 1e3:.2f} ms (threads {torch.get_num_threads()})")
    if not args.no_profiler:
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=25))


if __name__ == "__main__":
    main()
