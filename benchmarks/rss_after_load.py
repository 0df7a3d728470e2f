"""Resident memory of int4 servers after the side-by-side's load, at the same context budget:
qwen-serve int4 with its default KV pool (512 blocks of 16 = 8,192 tokens, float32), qwen-serve
int4 with bfloat16 KV and 1,024 blocks (16,384 tokens), and llama.cpp's server with Q4_0 weights
at -np 16 -c 16384 (16,384 tokens of f16 KV, allocated at start). Not run by CI.

    flock /work/cpu.lock python benchmarks/rss_after_load.py     # ~10 min on 2 cores

Each server is started alone, driven by `qwen-serve bench` with the side-by-side's decode runs
(64-token prompts, 128 output tokens, 1 / 8 / 16 streams) and its 512-token prefill, then left
idle for RSS_SETTLE_S before its RSS (with its children) is read. Prints a markdown table; writes
benchmarks/results/DATE-rss-after-load/rss_after_load.json.
"""
from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

from result_folder import result_folder
from servers import RSS_SETTLE_S, RunningServer, ServerCommand, run_bench
from setup_peers import Peers
from side_by_side import COMMON, DECODE, PER_SLOT_CONTEXT, PREFILL, llama, qwen

from qwen_serve.bench.machine import describe_machine, machine_header
from qwen_serve.cache_dir import cache_dir

SLOTS = 16  # llama.cpp's slots, each with PER_SLOT_CONTEXT tokens, as in the side-by-side's 16 streams
CONTEXT_TOKENS = SLOTS * PER_SLOT_CONTEXT  # 16,384


def servers(peers: Peers) -> list[ServerCommand]:
    return [
        ServerCommand("qwen-int4 (fp32 KV, 8,192 tokens)", qwen(peers, "--quant", "int4")),
        ServerCommand("qwen-int4 (bf16 KV, 16,384 tokens)", qwen(peers, "--quant", "int4", "--dtype", "bfloat16",
                                                                 "--kv-blocks", str(CONTEXT_TOKENS // 16))),
        ServerCommand("llama-q4_0 (f16 KV, 16,384 tokens)", llama(peers, peers.gguf_q4_0, SLOTS)),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", type=Path, default=cache_dir("peers"))
    args = parser.parse_args()
    peers = Peers(args.peers)
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        for command in servers(peers):
            with RunningServer(command) as server:
                loaded = server.resident_mib()
                tok_s = {}
                for i, bench_args in enumerate((DECODE, PREFILL)):
                    path = run_bench("server", server.url, Path(scratch), f"run{i}",
                                     [*COMMON, "--tokenizer", str(peers.checkpoint), "--no-bandwidth", *bench_args], "")
                    for result in json.loads(path.read_text())["endpoints"][0]["results"]:
                        tok_s[f"{result['prompt_tokens']}/{result['concurrency']}"] = result["output_tok_s"]
                time.sleep(RSS_SETTLE_S)
                rows.append({"server": command.name, "argv": server.argv, "rss_after_start_mib": round(loaded),
                             "rss_after_load_mib": round(server.resident_mib()), "output_tok_s": tok_s})
    machine = describe_machine()
    (result_folder("rss-after-load") / "rss_after_load.json").write_text(
        json.dumps({"measured": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine, "servers": rows}, indent=1) + "\n")
    print(machine_header(machine) + "\n")
    print("| server | RSS after start | RSS after the load, idle | out tok/s c=1 / 8 / 16 |\n|---|---|---|---|")
    for r in rows:
        t = r["output_tok_s"]
        print(f"| {r['server']} | {r['rss_after_start_mib']:,} MiB | {r['rss_after_load_mib']:,} MiB | "
              f"{t.get('64/1', 0):.1f} / {t.get('64/8', 0):.1f} / {t.get('64/16', 0):.1f} |")


if __name__ == "__main__":
    main()
