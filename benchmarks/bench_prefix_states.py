"""A hybrid model's prefix hit for a prompt that shares only the beginning of a long earlier one
(two agents' conversations over one long system prompt): the second prompt's time to first token
with the state snapshots' landmarks (kv/snapshot_index.py) and without them (least recently
used alone), in turns, in one process. Not run by CI.

    flock /work/cpu.lock python benchmarks/bench_prefix_states.py --qwen-dir CHECKPOINT
    python benchmarks/bench_prefix_states.py --qwen-dir CHECKPOINT --first 4096 --shared 3000 --tail 500

CHECKPOINT: a Qwen3.5 checkpoint (bench_hybrid.py makes random ones of the 0.8B and 2B
geometries). Each turn's prompts are fresh random tokens, so no turn hits another's snapshots.
"""
from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np
from engine_timing import timed_run

from qwen_serve.bench.machine import machine_header

TURNS = 2


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen-dir", type=Path, required=True)
    parser.add_argument("--quant", default="int4")
    parser.add_argument("--first", type=int, default=4096, help="the earlier prompt's tokens")
    parser.add_argument("--shared", type=int, default=3000, help="of them, what the second prompt starts with")
    parser.add_argument("--tail", type=int, default=500, help="the second prompt's own tokens after them")
    args = parser.parse_args()

    from qwen_serve import LLM

    print(machine_header(), flush=True)
    llm = LLM(str(args.qwen_dir), quant=args.quant, kv_blocks=4096, max_batch=16)
    cache = llm.parts.cache
    landmark_every = cache._landmark_every
    print(f"{args.qwen_dir.name} ({args.quant}); {cache.usage().states_total} state slots; the second prompt "
          f"shares {args.shared} of the first's {args.first} tokens and adds {args.tail}")
    rng = np.random.default_rng(0)
    seconds: dict[str, list[float]] = {"landmarks": [], "LRU alone": []}
    for turn in range(TURNS):
        for name in (list(seconds) if turn % 2 == 0 else list(seconds)[::-1]):
            cache._landmark_every = landmark_every if name == "landmarks" else 1 << 62
            first = rng.integers(100, 30000, size=args.first).tolist()
            timed_run(llm.engine, [first], 1)
            second = first[:args.shared] + rng.integers(30000, 60000, size=args.tail).tolist()
            hits_before = cache.state_hit_tokens
            prefill_s, _, _ = timed_run(llm.engine, [second], 1)
            seconds[name].append(prefill_s)
            print(f"  turn {turn + 1}, {name}: resumed at token {cache.state_hit_tokens - hits_before}, "
                  f"TTFT {prefill_s:.2f} s", flush=True)
    for name, values in seconds.items():
        print(f"{name}: TTFT of the second prompt {', '.join(f'{s:.2f}' for s in values)} s")


if __name__ == "__main__":
    main()
