"""One process against `qwen-serve ray` on the same machine, through `qwen-serve bench`: what
the Ray path costs per token (every output token crosses Ray once, replica -> ingress) and what
N replicas of fewer threads each give against one process using every core.

    flock /work/cpu.lock python benchmarks/bench_ray_scale_out.py           # SmolLM2, ~4 min

The ray command starts its own local cluster (Ray's processes are part of what it costs) and
stops it on exit. Writes benchmarks/results/DATE-ray-scale-out/ray_scale_out.json (+ PNGs) in the bench's
format: one "endpoint" per way of serving. Prompts have fresh token ids, so no prefix cache helps
either side: prefix-affinity routing is measured by tests/test_ray_cluster.py instead.
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys

from result_folder import result_folder
from servers import RunningServer, ServerCommand, run_bench

from qwen_serve.bench.machine import machine_header, source_commit

SERVE = [sys.executable, "-m", "qwen_serve"]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--replicas", type=int, default=2)
    p.add_argument("--concurrency", default="1,4,8")
    p.add_argument("--prompt-tokens", default="64")
    p.add_argument("--output-tokens", default="64")
    args = p.parse_args()
    cores = os.cpu_count() or 1
    threads = max(1, cores // args.replicas)
    servers = [
        ServerCommand("single", [*SERVE, "--port", "{port}"]),
        ServerCommand(f"ray-{args.replicas}x{threads}", [
            *SERVE, "ray", "--port", "{port}", "--replicas", str(args.replicas),
            "--cpus-per-replica", str(threads), "--threads-per-replica", str(threads)],
            stop_whole_group=False),  # `qwen-serve ray` stops the Ray cluster it started
    ]
    bench_args = ["--concurrency", args.concurrency, "--prompt-tokens", args.prompt_tokens,
                  "--output-tokens", args.output_tokens, "--api", "completions", "--repetitions", "2",
                  "--rounds", "2", "--warmup", "1", "--no-progress"]
    folder = result_folder("ray-scale-out")
    out_dir = folder / "raw"
    out_dir.mkdir(exist_ok=True)
    print(machine_header())
    paths = []
    for command in servers:
        with RunningServer(command) as server:
            note = f"{' '.join(command.argv)} (qwen-serve {source_commit()}, {cores} cores)"
            paths.append(run_bench(command.name, server.url, out_dir, f"ray_scale_out-{command.name}", bench_args,
                                   note))
            print(f"[{command.name}] resident {server.resident_mib():.0f} MiB (server and its children)", flush=True)
    subprocess.run([*SERVE, "bench", "--merge", *map(str, paths), "--out", str(folder), "--name", "ray_scale_out"],
                   check=True)
    leftovers = subprocess.run(["pgrep", "-f", "raylet|gcs_server"], capture_output=True, text=True).stdout.split()
    print(f"Ray processes left running: {leftovers or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
