"""The one-call decode step (fused_decode.py) against the per-op path, in turns in one process:
this VM's memory changes speed for minutes at a time, so the two paths take turns on the same
model and the same kind of request, a few seconds each.

    python benchmarks/fused_step_turns.py --qwen-dir CHECKPOINT --quant int4
    python benchmarks/fused_step_turns.py --qwen-dir CHECKPOINT_WITH_MTP --speculative mtp --k 3

Each turn generates --max-tokens tokens for one random --context-token prompt (greedy) and
prints ms per engine step, and, for steps that verify drafts, the model's time on them alone.
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
    parser.add_argument("--context", type=int, default=64)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--speculative", choices=("mtp", "ngram"), default=None)
    parser.add_argument("--k", type=int, default=3, help="draft tokens a step, with --speculative")
    parser.add_argument("--turns", type=int, default=4)
    args = parser.parse_args()

    from qwen_serve import LLM, SamplingParams
    from qwen_serve.bench.machine import machine_header

    print(machine_header())
    options = {"speculative": args.speculative, "num_speculative_tokens": args.k} if args.speculative else {}
    llm = LLM(str(args.qwen_dir), dtype=args.dtype, quant=args.quant, **options)
    engine, model = llm.engine, llm.engine.executor
    fused = model.fused
    if fused is None:
        raise SystemExit("this model and CPU take no one-call step (fused_decode.py): nothing to compare")
    counts = {"steps": 0, "verify": 0, "verify_s": 0.0}
    step, execute = engine.step, model.execute

    def counted_step():
        counts["steps"] += 1
        return step()

    def timed_execute(batch, cache):
        t = time.perf_counter()
        out = execute(batch, cache)
        if any(chunk.num_draft for chunk in batch.chunks):
            counts["verify"] += 1
            counts["verify_s"] += time.perf_counter() - t
        return out

    engine.step, model.execute = counted_step, timed_execute
    rng = np.random.default_rng(0)
    params = SamplingParams(max_tokens=args.max_tokens, ignore_eos=True)
    llm.generate([rng.integers(100, 30000, size=args.context).tolist()], params)  # warm-up
    for turn in range(args.turns):
        line = []
        for name, path in (("one call", fused), ("per op", None)):
            model.fused = path
            counts.update(steps=0, verify=0, verify_s=0.0)
            drafts = engine.stats.draft_tokens_total
            t = time.perf_counter()
            llm.generate([rng.integers(100, 30000, size=args.context).tolist()], params)
            wall = time.perf_counter() - t
            text = f"{name} {wall / counts['steps'] * 1e3:.1f} ms a step ({counts['steps']} steps"
            if counts["verify"]:
                text += (f", {engine.stats.draft_tokens_total - drafts} drafts; verifying "
                         f"{counts['verify_s'] / counts['verify'] * 1e3:.1f} ms x {counts['verify']}")
            line.append(text + ")")
        print(f"turn {turn + 1}: " + " | ".join(line), flush=True)
    model.fused = fused


if __name__ == "__main__":
    main()
