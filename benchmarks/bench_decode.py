"""In-process decode and prefill speed of the torch backend on the Qwen3-0.6B geometry (random
weights), with the machine's bandwidth bound beside each figure.

    python benchmarks/bench_decode.py --qwen-dir /tmp/qwen3-0.6b                  # int4, float32, bfloat16
    python benchmarks/bench_decode.py --qwen-dir /tmp/qwen3-0.6b --configs int4 --parts decode
    python benchmarks/bench_decode.py ... --before /tmp/base   # also run an older tree, side by side

Each configuration runs in a fresh subprocess (``--one``): decode tok/s at batch 1, 8 and 16
(64-token prompts, 32 decode steps timed, best of 2), 512-token prefill tok/s, and decode at
context 256, 1k and 4k for 1 and 8 streams (distinct prompts at 256 and 1k; at 4k the 8 streams
share a 4,080-token prefix through the prefix cache, so the prefill stays short — the decode
still attends over 4k positions per stream). The bandwidth bound beside batch 1 is the weights'
bytes over the median of bandwidth readings taken between the measurements (BandwidthProbe);
batch 1 also runs 7 times, each against the reading right after it, and the median of those
ratios is reported beside (decode_b1_of_bound_paired). ``--before DIR`` runs the same measurements on a
tree laid out as an importable ``qwen_serve`` package in DIR (see ``--make-before``), so the
before and after figures come from one sitting. Results go to
benchmarks/results/DATE-decode-LABEL/ as JSON: the machine (CPU model and flags, versions, commit)
and per run the bandwidth measured (torch sum over 1 GiB, all threads) and threads.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import engine_timing
from result_folder import result_folder

CONFIGS = {"int4": ("float32", "int4"), "float32": ("float32", "none"), "bfloat16": ("bfloat16", "none")}
DECODE_STEPS = 32
PAIRED_RUNS = 7  # batch-1 runs, each paired with a bandwidth reading
CONTEXTS = (256, 1024, 4096)


def conditions() -> dict:
    """What a run's subprocess ran with (the machine itself is described once, by the parent:
    the subprocess may run an older tree)."""
    import torch

    return {"threads": torch.get_num_threads()}


class BandwidthProbe:
    """torch sum over 1 GiB (all threads), best of 3, taken between the measurements: on a shared
    machine whose bandwidth drifts by the minute (22-58 GB/s within an hour here), one reading at
    the start made the "x of bound" figures say more about that minute than about the code. The
    bound uses the median of the readings."""

    def __init__(self) -> None:
        import torch

        self.data = torch.ones(1 << 28)  # 1 GiB of float32
        self.data.sum()
        self.readings: list[float] = []

    def read(self) -> None:
        best = min(_timed(self.data.sum) for _ in range(3))
        self.readings.append(self.data.numel() * 4 / best / 1e9)

    def summary(self) -> dict:
        return {"bandwidth_gb_s": statistics.median(self.readings), "bandwidth_readings_gb_s": self.readings}


def _timed(fn) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


def run_one(model: str, dtype: str, quant: str, parts: list[str]) -> dict:
    import numpy as np

    from qwen_serve import LLM

    t = time.perf_counter()
    llm = LLM(model, dtype=dtype, quant=quant, kv_blocks=2048, max_batch=16, chunk_size=512)
    result = {"load_s": time.perf_counter() - t, "weight_bytes": llm.parts.executor.weight_bytes(),
              "conditions": conditions()}
    probe = BandwidthProbe()
    engine, vocab = llm.engine, llm.config.vocab_size
    rng = np.random.default_rng(0)

    def prompt(n: int) -> list[int]:
        return rng.integers(100, min(vocab, 30000), size=n).tolist()

    def run(prompts: list[list[int]], max_tokens: int) -> tuple[float, float, int]:
        return engine_timing.timed_run(engine, prompts, max_tokens)

    run([prompt(32)], 4)  # warm-up
    probe.read()
    if "decode" in parts:
        for batch in (1, 8, 16):
            best, of_bound = 0.0, []
            for _ in range(PAIRED_RUNS if batch == 1 else 2):
                _, decode_s, decoded = run([prompt(64) for _ in range(batch)], DECODE_STEPS + 1)
                best = max(best, decoded / decode_s)
                probe.read()
                of_bound.append(decoded / decode_s / bound(result["weight_bytes"], probe.readings[-1]))
            result[f"decode_b{batch}_tok_s"] = best
            if batch == 1:  # each run against the reading taken right after it
                result["decode_b1_of_bound_paired"] = statistics.median(of_bound)
    if "prefill" in parts:
        result["prefill512_tok_s"] = 512 / min(run([prompt(512)], 1)[0] for _ in range(2))
    if "context" in parts:
        for context in CONTEXTS:
            for streams in (1, 8):
                if context == CONTEXTS[-1] and streams > 1:
                    shared = prompt(context - 16)
                    prompts = [shared + prompt(16) for _ in range(streams)]
                else:
                    prompts = [prompt(context) for _ in range(streams)]
                _, decode_s, decoded = run(prompts, 17)
                result[f"ctx{context}_s{streams}_tok_s"] = decoded / decode_s
                probe.read()
    result["conditions"].update(probe.summary())
    return result


def make_before(commit: str, target: Path) -> None:
    """Lay out ``commit`` of this repository as an importable qwen_serve package in target."""
    repo = Path(__file__).resolve().parent.parent
    with tempfile.TemporaryDirectory() as tmp:
        subprocess.run(f"git -C {repo} archive {commit} | tar -x -C {tmp}", shell=True, check=True)
        if target.exists():
            shutil.rmtree(target)
        shutil.copytree(Path(tmp) / "core", target / "qwen_serve")
        for sub in ("backends", "plugins", "conformance"):
            if (Path(tmp) / sub).exists():
                shutil.copytree(Path(tmp) / sub, target / "qwen_serve" / sub)


def bound(weight_bytes: int, bandwidth: float) -> float:
    return bandwidth * 1e9 / weight_bytes


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--qwen-dir", type=Path, required=True, help="the random Qwen3-0.6B checkpoint (made if absent)")
    parser.add_argument("--configs", default="int4,float32,bfloat16")
    parser.add_argument("--parts", default="decode,prefill,context")
    parser.add_argument("--before", type=Path, help="a tree made by --make-before, measured first")
    parser.add_argument("--make-before", nargs=2, metavar=("COMMIT", "DIR"), help="lay out COMMIT in DIR and exit")
    parser.add_argument("--label", default="run")
    parser.add_argument("--one", nargs=3, metavar=("DTYPE", "QUANT", "PARTS"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.make_before:
        make_before(args.make_before[0], Path(args.make_before[1]))
        return
    if args.one:
        print(json.dumps(run_one(str(args.qwen_dir), args.one[0], args.one[1], args.one[2].split(","))))
        return
    if not (args.qwen_dir / "config.json").exists():
        from qwen_serve.conformance.models import QWEN3_0_6B, make_qwen3_checkpoint

        make_qwen3_checkpoint(args.qwen_dir, QWEN3_0_6B, seed=3, dtype="bfloat16", init_std=0.05)
    from qwen_serve.bench.machine import (  # here: --one may run a --before tree without it
        describe_machine,
        machine_header,
    )

    machine = describe_machine(measure_bandwidth=False)
    print(machine_header(machine), flush=True)
    trees = ([("before", args.before)] if args.before else []) + [("after", None)]
    results = {}
    for config in args.configs.split(","):
        dtype, quant = CONFIGS[config]
        for tree, path in trees:
            env = dict(os.environ)
            if path is not None:
                env["PYTHONPATH"] = str(path)
            out = subprocess.run([sys.executable, __file__, "--qwen-dir", str(args.qwen_dir), "--one", dtype, quant,
                                  args.parts], capture_output=True, text=True, env=env, cwd="/")
            if out.returncode != 0:
                print(f"{config} {tree} failed:\n{out.stderr[-3000:]}", flush=True)
                continue
            r = json.loads(out.stdout.strip().splitlines()[-1])
            results[f"{config}/{tree}"] = r
            m = r["conditions"]
            figures = {k: round(v, 1) for k, v in r.items() if k.endswith("tok_s")}
            ceiling = bound(r["weight_bytes"], m["bandwidth_gb_s"])
            b1 = figures.get("decode_b1_tok_s")
            paired = r.get("decode_b1_of_bound_paired")
            ratio = f", batch 1 at {b1 / ceiling:.2f}x of it" if b1 else ""
            ratio += f" ({paired:.2f}x, median of runs each against the reading after it)" if paired else ""
            print(f"{config:9s} {tree:6s} weights {r['weight_bytes'] / 2**20:7.1f} MiB, bandwidth "
                  f"{m['bandwidth_gb_s']:.1f} GB/s -> bound {ceiling:.1f} tok/s{ratio}; {figures}", flush=True)
    if results:
        path = result_folder(f"decode-{args.label}") / f"decode-{args.label}.json"
        path.write_text(json.dumps({"machine": machine, "runs": results}, indent=1))
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
