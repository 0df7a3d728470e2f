"""Slow strangers beside normal clients: 8 streaming clients measured by `qwen-serve bench`,
alone and then while hundreds of connections trickle request bodies (a POST head announcing
100,000 bytes, then one byte every few seconds; each one closed by the server reconnects) for
the whole run. The normal clients' TTFT should stay within 2x of the run alone, with no 429.

    flock /work/cpu.lock python benchmarks/slow_clients.py                 # SmolLM2, 500 slow clients
    flock /work/cpu.lock python benchmarks/slow_clients.py --slow 500 --model PATH --quant int4

One server at a time, on loopback. Writes benchmarks/results/DATE-slow-clients/slow_clients.json and prints a table.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

from result_folder import result_folder
from servers import RunningServer, ServerCommand, run_bench

from qwen_serve.bench.machine import describe_machine, machine_header

BENCH = ["--prompt-tokens", "64", "--output-tokens", "64", "--concurrency", "8", "--repetitions", "8",
         "--warmup", "1"]  # over a minute on 2 cores, the slow clients held throughout
TRICKLE_S = 5.0  # between a slow client's bytes


class SlowClients:
    """n connections, each forever sending a body one byte at a time, reconnecting when closed."""

    def __init__(self, port: int, n: int) -> None:
        self.port, self.n = port, n
        self.statuses: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._run()), daemon=True)

    def __enter__(self) -> "SlowClients":
        self._thread.start()
        time.sleep(2.0)  # let them connect before the measurement starts
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=30)

    async def _run(self) -> None:
        await asyncio.gather(*(self._one() for _ in range(self.n)))

    async def _one(self) -> None:
        head = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: slow\r\nContent-Type: application/json\r\n"
                b"Content-Length: 100000\r\n\r\n{")
        while not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
                writer.write(head)
                while not self._stop.is_set() and not reader.at_eof():
                    try:
                        line = await asyncio.wait_for(reader.readline(), TRICKLE_S)
                    except asyncio.TimeoutError:
                        writer.write(b" ")
                        await writer.drain()
                        continue
                    if line.startswith(b"HTTP/1.1 "):
                        status = line.split()[1].decode()
                        self.statuses[status] = self.statuses.get(status, 0) + 1
                    if not line:
                        break
                writer.close()
            except OSError:
                pass
            await asyncio.sleep(0.1)


def figures(path: Path) -> dict:
    result = json.loads(path.read_text())["endpoints"][0]["results"][0]
    return {"ttft_p50_s": result["ttft_s"]["p50"], "ttft_p95_s": result["ttft_s"]["p95"],
            "output_tok_s": result["output_tok_s"], "failed": result["failed"], "errors": result["errors"][:3]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--slow", type=int, default=500, help="slow connections held open (default 500)")
    parser.add_argument("--model", default=None, help="served model (default: the embedded SmolLM2)")
    parser.add_argument("--quant", default="none")
    parser.add_argument("--out", type=Path, help="default: results/DATE-slow-clients/slow_clients.json")
    args = parser.parse_args()
    flags = ["--quant", args.quant] + (["--model", args.model] if args.model else [])
    command = ServerCommand("qwen-serve", [sys.executable, "-m", "qwen_serve", "--port", "{port}", *flags])
    runs: dict[str, dict] = {}
    with RunningServer(command) as server, tempfile.TemporaryDirectory() as tmp:
        url = f"http://127.0.0.1:{server.port}"
        bench = BENCH  # token-id prompts of exact length through /v1/completions
        runs["alone"] = figures(run_bench("alone", url, Path(tmp), "alone", bench, "no slow clients"))
        rss_before = server.resident_mib()
        with SlowClients(server.port, args.slow) as slow:
            started = time.monotonic()
            runs["with_slow"] = figures(run_bench("slow", url, Path(tmp), "slow", bench, f"{args.slow} slow clients"))
            runs["with_slow"].update(slow_statuses=dict(slow.statuses), held_s=time.monotonic() - started)
        runs["with_slow"]["rss_mib"] = (rss_before, server.resident_mib())
        runs["alone_after"] = figures(run_bench("after", url, Path(tmp), "after", bench, "no slow clients, after"))
    alone_p50 = min(runs["alone"]["ttft_p50_s"], runs["alone_after"]["ttft_p50_s"])  # the faster bracket
    ratio = runs["with_slow"]["ttft_p50_s"] / alone_p50
    machine = describe_machine(measure_bandwidth=False)
    document = {"machine": machine, "slow_clients": args.slow, "server": command.argv, "runs": runs,
                "ttft_p50_ratio": ratio, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out = args.out or result_folder("slow-clients") / "slow_clients.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(machine_header(machine))
    for name, run in runs.items():
        print(f"{name:10s} TTFT p50 {run['ttft_p50_s'] * 1e3:7.0f} ms  p95 {run['ttft_p95_s'] * 1e3:7.0f} ms  "
              f"{run['output_tok_s']:6.1f} tok/s  failed {run['failed']}")
    print(f"TTFT p50 with {args.slow} slow clients (held {runs['with_slow']['held_s']:.0f} s) / the faster run "
          f"alone: {ratio:.2f}x; slow clients' answers "
          f"{runs['with_slow']['slow_statuses']}; RSS {runs['with_slow']['rss_mib'][0]:.0f} -> "
          f"{runs['with_slow']['rss_mib'][1]:.0f} MiB; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
