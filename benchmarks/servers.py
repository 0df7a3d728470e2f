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
from typing import Sequence

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
