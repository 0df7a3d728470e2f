"""Prefill speed and time to first token by prompt length, in-process, on the Qwen3-0.6B geometry
(random weights): the curve should have no cliff where a row-count threshold once sat.

    flock /work/cpu.lock python benchmarks/prefill.py --qwen-dir /tmp/qwen3-0.6b
    python benchmarks/prefill.py --qwen-dir /tmp/qwen3-0.6b --configs int4 --lengths 64,72,128

Each configuration (int4, bfloat16, float32) loads in a fresh subprocess; each length runs one
prompt of distinct random tokens (no prefix hits) to its first token, best of 3: TTFT is that
time (the steps that prefill and sample the first token), prefill tok/s the length over it.
Results go to benchmarks/results/DATE-NAME/ as JSON with the machine (CPU model and flags,
versions, commit), and as a PNG.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from bench_decode import CONFIGS, conditions
from result_folder import result_folder

from qwen_serve.bench.machine import describe_machine, machine_header

LENGTHS = (16, 32, 48, 64, 72, 96, 128, 192, 256, 384, 512, 1024, 2048)
REPEATS = 3


def run_one(model: str, dtype: str, quant: str, lengths: list[int]) -> dict:
    import numpy as np
    from engine_timing import timed_run

    from qwen_serve import LLM

    llm = LLM(model, dtype=dtype, quant=quant, kv_blocks=1024, max_batch=16, chunk_size=512)
    rng = np.random.default_rng(0)

    def ttft(n: int) -> float:
        prefill_s, _, _ = timed_run(llm.engine, [rng.integers(100, 30000, size=n).tolist()], 1)
        return prefill_s

    ttft(32)  # warm-up
    result = {"conditions": conditions(), "ttft_s": {}, "prefill_tok_s": {}}
    for n in lengths:
        best = min(ttft(n) for _ in range(REPEATS))
        result["ttft_s"][n], result["prefill_tok_s"][n] = best, n / best
        print(f"  {n:5d} tokens: TTFT {best * 1e3:8.1f} ms, {n / best:7.1f} tok/s", file=sys.stderr, flush=True)
    return result


def plot(results: dict, cpu: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for name, result in results.items():
        lengths = [int(n) for n in result["prefill_tok_s"]]
        axis.plot(lengths, list(result["prefill_tok_s"].values()), marker="o", label=name)
    axis.set_xscale("log", base=2)
    axis.set_xlabel("prompt tokens")
    axis.set_ylabel("prefill tok/s")
    axis.set_title(f"prefill by prompt length, {cpu}", fontsize=9)
    axis.legend()
    axis.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen-dir", type=Path, required=True, help="the random Qwen3-0.6B checkpoint (made if absent)")
    parser.add_argument("--configs", default="int4,bfloat16,float32", help=f"of {', '.join(CONFIGS)}")
    parser.add_argument("--lengths", default=",".join(map(str, LENGTHS)), help="prompt lengths in tokens")
    parser.add_argument("--name", default="prefill", help="the results go to results/DATE-NAME/NAME.json and .png")
    parser.add_argument("--one", nargs=2, metavar=("DTYPE", "QUANT"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    lengths = [int(n) for n in args.lengths.split(",")]
    if args.one:
        print(json.dumps(run_one(str(args.qwen_dir), *args.one, lengths)))
        return
    if not (args.qwen_dir / "config.json").exists():
        from qwen_serve.conformance.models import QWEN3_0_6B, make_qwen3_checkpoint

        make_qwen3_checkpoint(args.qwen_dir, QWEN3_0_6B, seed=3, dtype="bfloat16", init_std=0.05)
    machine = describe_machine(measure_bandwidth=False)
    print(machine_header(machine), flush=True)
    results = {}
    for name in args.configs.split(","):
        print(f"{name}:", file=sys.stderr, flush=True)
        out = subprocess.run([sys.executable, __file__, "--qwen-dir", str(args.qwen_dir), "--lengths", args.lengths,
                              "--one", *CONFIGS[name]], check=True, capture_output=True, text=True)
        sys.stderr.write(out.stderr[-4000:] if "Traceback" in out.stderr else "")
        results[name] = json.loads(out.stdout.splitlines()[-1])
    print(f"{next(iter(results.values()))['conditions']['threads']} threads")
    print(f"{'tokens':>8s}" + "".join(f"{name + ' TTFT ms':>18s}{'tok/s':>8s}" for name in results))
    for n in lengths:
        print(f"{n:8d}" + "".join(f"{r['ttft_s'][str(n)] * 1e3:18.1f}{r['prefill_tok_s'][str(n)]:8.0f}"
                                  for r in results.values()))
    folder = result_folder(args.name)
    (folder / f"{args.name}.json").write_text(json.dumps({"machine": machine, "runs": results}, indent=1))
    plot(results, machine["cpu"]["model_name"], folder / f"{args.name}.png")
    print(f"wrote {folder / args.name}.json and .png")


if __name__ == "__main__":
    main()
