"""The side-by-side of issue 10: qwen-serve (int4, fp32, bf16), llama.cpp's server (Q4_0, BF16)
and vLLM's CPU build (bf16) on the same random Qwen3-0.6B weights, all measured by `qwen-serve
bench` with the same client and prompts: one server at a time, or (--in-turns) a group of
servers up together with their repetitions interleaved, which on a shared machine whose speed
drifts is what makes their ratios trustworthy.

    python benchmarks/setup_peers.py                        # once: builds and installs the peers
    flock /work/cpu.lock python benchmarks/side_by_side.py  # everything (~1 h on 2 cores), then the report
    flock /work/cpu.lock python benchmarks/side_by_side.py --only qwen-int4 --only llama-q4_0   # some servers
    flock /work/cpu.lock python benchmarks/side_by_side.py --in-turns qwen-bf16,llama-bf16,vllm-bf16
    python benchmarks/side_by_side.py --report --out FOLDER # merge what is measured there: JSON, PNG, markdown
    flock /work/cpu.lock python benchmarks/side_by_side.py --label icelake --only qwen-int4   # a CPU's own sitting

Per server: decode with 64-token prompts and 128 output tokens at concurrency 1, 8, 16, and
prefill of a 512-token prompt with 1 output token (prefill tok/s, TTFT); 3 repetitions, medians.
llama.cpp is restarted for each concurrency with -np set to it (-np 1 for prefill). `scheduler`
runs qwen-serve int4 with --batching static and continuous under the same uneven load and
samples batch occupancy from /metrics. Results go to benchmarks/results/DATE-side-by-side[-LABEL]/
(raw/ per server, side_by_side.json/.md and PNGs merged, static_vs_continuous.* for the scheduler),
or to the folder --out names (to add servers to an earlier sitting, or --report it), so a sitting
on another CPU kind stands beside the others instead of mixing with them. Every server's stdout
goes to a temporary log whose tail is printed if it fails.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from result_folder import dated_folder
from servers import (
    RSS_SETTLE_S,
    RunningServer,
    ServerCommand,
    combine_launches,
    run_bench,
    run_bench_in_turns,
    vllm_server,
    write_combined,
)
from setup_peers import Peers
from side_by_side_report import report

from qwen_serve.bench.machine import machine_header, source_commit
from qwen_serve.cache_dir import cache_dir

CONCURRENCY = (1, 8, 16)
DECODE = ["--prompt-tokens", "64", "--output-tokens", "128", "--concurrency", ",".join(map(str, CONCURRENCY))]
PREFILL = ["--prefill"]
COMMON = ["--api", "chat", "--repetitions", "3", "--warmup", "1"]
PER_SLOT_CONTEXT = 1024  # llama.cpp: -c is shared by the -np slots
THREADS = str(os.cpu_count() or 2)


def qwen(peers: Peers, *flags: str) -> list[str]:
    return [sys.executable, "-m", "qwen_serve", "--model", str(peers.checkpoint), "--host", "127.0.0.1",
            "--port", "{port}", *flags]


def llama(peers: Peers, gguf: Path, slots: int) -> list[str]:
    return [str(peers.llama_bin("llama-server")), "-m", str(gguf), "--host", "127.0.0.1", "--port", "{port}",
            "-np", str(slots), "-c", str(PER_SLOT_CONTEXT * slots), "-t", THREADS, "-tb", THREADS, "--metrics"]


def peer_version(name: str, peers: Peers) -> str:
    if name.startswith("llama"):
        out = subprocess.run([str(peers.llama_bin("llama-server")), "--version"], capture_output=True, text=True)
        return " ".join((out.stdout + out.stderr).split())[:200]
    if name.startswith("vllm"):
        out = subprocess.run([str(peers.vllm_python), "-c", "import vllm, torch; print('vllm', vllm.__version__, "
                              "'torch', torch.__version__)"], capture_output=True, text=True)
        return out.stdout.strip() or out.stderr.strip()[-300:]
    return f"qwen-serve {source_commit()}"


# As a user starts them: int4 with the server's float32 activations (bf16 activations cost on a CPU
# without BF16 units: 25.2 vs 33.4 tok/s single-stream on Ice Lake), the KV dtype the server picks.
QWEN_FLAGS = {"qwen-int4": ["--quant", "int4"], "qwen-fp32": [], "qwen-bf16": ["--dtype", "bfloat16"]}


# The bench runs one at a time, with the streams each has in flight (llama.cpp's -np).
STAGES = [([*DECODE[:4], "--concurrency", str(c)], c) for c in CONCURRENCY] + [(PREFILL, 1)]


def server_command(name: str, peers: Peers, slots: int) -> ServerCommand:
    """How `name` is started for `slots` concurrent streams (only llama.cpp's -np depends on it)."""
    if name in QWEN_FLAGS:
        return ServerCommand(name, qwen(peers, *QWEN_FLAGS[name]))
    if name in ("llama-q4_0", "llama-bf16"):
        return ServerCommand(name, llama(peers, peers.gguf_q4_0 if name == "llama-q4_0" else peers.gguf_bf16, slots))
    if name == "vllm-bf16":
        return vllm_server(name, peers.vllm_python, peers.checkpoint, "qwen3-0.6b-random", 2048, 16)
    raise SystemExit(f"unknown server {name!r}; known: {', '.join(SERVERS)}")


def launches(name: str, peers: Peers) -> list[tuple[ServerCommand, list[list[str]]]]:
    """Each launch a server needs: the server to start and the bench runs to make against it."""
    if name.startswith("llama"):  # restarted for each concurrency with -np set to it
        return [(server_command(name, peers, slots), [args]) for args, slots in STAGES]
    return [(server_command(name, peers, 1), [DECODE, PREFILL])]


SERVERS = ("qwen-int4", "qwen-fp32", "qwen-bf16", "llama-q4_0", "llama-bf16", "vllm-bf16")


def measure(name: str, peers: Peers, raw: Path) -> Path:
    raw.mkdir(parents=True, exist_ok=True)
    version = peer_version(name, peers)
    paths = []
    for command, runs in launches(name, peers):
        with RunningServer(command) as server:
            note = f"{version}; {' '.join(server.argv)}"
            for bench_args in runs:
                path = run_bench(name, server.url, raw, f"{name}.{len(paths)}",
                                 [*COMMON, "--tokenizer", str(peers.checkpoint), *bench_args], note)
                document = json.loads(path.read_text())
                time.sleep(RSS_SETTLE_S)
                document["endpoints"][0]["resident_mib_after"] = round(server.resident_mib(), 1)
                path.write_text(json.dumps(document, indent=1) + "\n")
                paths.append(path)
    out = combine_launches(paths, raw / f"{name}.json")
    for p in paths:
        p.unlink()
    return out


IDLE_PROBE_S = 2.0


def measure_in_turns(names: list[str], peers: Peers, raw: Path) -> list[Path]:
    """The servers up together, each stage's repetitions taking turns between them (`bench
    --interleave`): on a shared machine whose speed drifts by minutes, their ratios are then
    measured seconds apart. llama.cpp is restarted with -np for each stage; the others stay up.
    Before each stage every server's CPU use while idle is read, so none eats into another's turn
    unnoticed. Each server's figures go to raw/NAME.json as in the one-at-a-time mode, marked
    with the group and this sitting."""
    raw.mkdir(parents=True, exist_ok=True)
    versions = {name: peer_version(name, peers) for name in names}
    sitting = {"with": names, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    running: dict[str, RunningServer] = {}
    parts: dict[str, list[dict]] = {name: [] for name in names}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            for i, (bench_args, slots) in enumerate(STAGES):
                for name in names:
                    _ensure_running(running, server_command(name, peers, slots))
                idle = _idle_cpu(running)
                print("idle CPU: " + ", ".join(f"{n} {v:.0%}" for n, v in idle.items()), flush=True)
                endpoints = [(name, running[name].url, f"{versions[name]}; {' '.join(running[name].argv)}; "
                              f"idle CPU before this stage {idle[name]:.0%}") for name in names]
                path = run_bench_in_turns(endpoints, Path(scratch), f"turns.{i}",
                                          [*COMMON, "--tokenizer", str(peers.checkpoint), *bench_args])
                time.sleep(RSS_SETTLE_S)
                document = json.loads(path.read_text())
                for endpoint in document["endpoints"]:  # one document per server, as a launch of its own
                    endpoint.update(resident_mib_after=round(running[endpoint["name"]].resident_mib(), 1),
                                    in_turns=sitting)
                    parts[endpoint["name"]].append({**document, "endpoints": [endpoint]})
        finally:
            for server in running.values():
                try:
                    server.stop()
                except Exception as exc:  # stop the others whatever one of them does
                    print(f"[{server.command.name}] stopping: {exc}", file=sys.stderr)
    return [write_combined(documents, raw / f"{name}.json") for name, documents in parts.items()]


def _ensure_running(running: dict[str, RunningServer], command: ServerCommand) -> None:
    """`command` up under its name, restarting that server if it runs with other arguments."""
    current = running.get(command.name)
    if current is not None and current.command.argv != command.argv:
        running.pop(command.name).stop()
    if command.name not in running:
        running[command.name] = server = RunningServer(command)
        server.__enter__()  # stopped by the caller's cleanup from here on, even if this raises


def _idle_cpu(running: dict[str, RunningServer]) -> dict[str, float]:
    """Each server's share of one CPU over IDLE_PROBE_S with no requests, summed over the
    processes alive at both readings (a child that starts or ends in between is left out)."""
    before = {name: server.cpu_ticks() for name, server in running.items()}
    time.sleep(IDLE_PROBE_S)
    out = {}
    for name, server in running.items():
        after = server.cpu_ticks()
        ticks = sum(after[pid] - t for pid, t in before[name].items() if pid in after)
        out[name] = ticks / os.sysconf("SC_CLK_TCK") / IDLE_PROBE_S
    return out


def scheduler(peers: Peers, folder: Path) -> Path:
    """qwen-serve int4 under 16 streams of uneven output length (16-256 tokens), max batch 8:
    static vs continuous batching, with batch occupancy sampled from /metrics."""
    raw = folder / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    paths = []
    for mode in ("static", "continuous"):
        name = f"qwen-int4-{mode}"
        command = ServerCommand(name, qwen(peers, "--quant", "int4", "--max-batch", "8", "--batching", mode))
        with RunningServer(command) as server:
            paths.append(run_bench(name, server.url, raw, name, [
                "--api", "chat", "--tokenizer", str(peers.checkpoint), "--prompt-tokens", "64",
                "--output-tokens", "16:256", "--concurrency", "16", "--rounds", "2", "--repetitions", "1",
                "--warmup", "1", "--sample-metrics", "0.1"], f"qwen-serve {source_commit()}; {' '.join(server.argv)}"))
    subprocess.run([sys.executable, "-m", "qwen_serve", "bench", "--merge", *map(str, paths), "--out", str(folder),
                    "--name", "static_vs_continuous"], check=True)
    return folder / "static_vs_continuous.json"


def check_groups(parser: argparse.ArgumentParser, groups: list[list[str]], only: list[str] | None) -> None:
    """Before any server starts (vLLM's start takes minutes): every group two or more known
    servers, none in two groups, and not mixed with --only."""
    if groups and only:
        parser.error("--in-turns and --only measure differently: give one of them")
    seen = [n for group in groups for n in group]
    for name in seen:
        if name not in SERVERS:
            parser.error(f"unknown server {name!r}; known: {', '.join(SERVERS)}")
    if any(len(group) < 2 for group in groups):
        parser.error("--in-turns takes two or more servers, comma-separated")
    if len(set(seen)) < len(seen):
        parser.error("a server may be in one --in-turns group only, once")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=(*SERVERS, "scheduler"), help="measure only these")
    parser.add_argument("--in-turns", action="append", default=[], metavar="A,B[,C]",
                        help="two or more servers up together, their repetitions interleaved (repeatable: one group "
                             "each, a server in one group only)")
    parser.add_argument("--report", action="store_true", help="only merge what is measured and write the report")
    parser.add_argument("--peers", type=Path, default=cache_dir("peers"), help="where setup_peers.py put the peers")
    parser.add_argument("--label", default=None, metavar="NAME",
                        help="name this sitting: its folder is results/DATE-side-by-side-NAME/")
    parser.add_argument("--out", type=Path, default=None, metavar="FOLDER",
                        help="measure into (or --report) this folder instead of today's")
    args = parser.parse_args(argv)
    folder = args.out or dated_folder("side-by-side" + (f"-{args.label}" if args.label else ""))
    raw = folder / "raw"
    groups = [[n.strip() for n in group.split(",") if n.strip()] for group in args.in_turns]
    check_groups(parser, groups, args.only)
    peers = Peers(args.peers.expanduser().resolve())
    if not args.report:
        print(machine_header(), flush=True)
        for group in groups:
            try:
                measure_in_turns(group, peers, raw)
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                print(f"{','.join(group)}: FAILED: {exc}", file=sys.stderr)
        for name in [] if groups else args.only or (*SERVERS, "scheduler"):
            try:
                scheduler(peers, folder) if name == "scheduler" else measure(name, peers, raw)
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                print(f"{name}: FAILED: {exc}", file=sys.stderr)
    report(SERVERS, folder, "side_by_side" + (f"-{args.label}" if args.label else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
