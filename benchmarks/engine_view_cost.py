"""What watching costs: batch-8 decode measured by `qwen-serve bench` with the engine view's
event stream (/engine/stream, what the page at /engine reads) closed and open, in alternating
runs on one server (closed first in even pairs, open first in odd ones), the stream's bytes and
frames per second while open, and what an idle server's stream sends.

    flock /work/cpu.lock python benchmarks/engine_view_cost.py                # SmolLM2, 2 pairs
    flock /work/cpu.lock python benchmarks/engine_view_cost.py --pairs 3 --model PATH --quant int4

One server at a time, on loopback. Writes benchmarks/results/DATE-engine-view/engine_view.json
and prints a table.
"""
from __future__ import annotations

import argparse
import http.client
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

from result_folder import result_folder
from servers import RunningServer, ServerCommand, run_bench

from qwen_serve.bench.machine import describe_machine, machine_header

BENCH = ["--prompt-tokens", "64", "--output-tokens", "128", "--concurrency", "8", "--repetitions", "4",
         "--warmup", "1"]


class Watcher:
    """One reader of /engine/stream for as long as it is entered, counting what arrives."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.bytes = 0
        self.frames = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)

    def __enter__(self) -> "Watcher":
        self.started = time.monotonic()
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.seconds = time.monotonic() - self.started
        self._stop.set()
        self._thread.join(timeout=10)

    def _read(self) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        conn.request("GET", "/engine/stream")
        response = conn.getresponse()
        assert response.status == 200, response.status
        while not self._stop.is_set():
            line = response.fp.readline()
            if not line:
                break
            self.bytes += len(line)
            self.frames += line.startswith(b"data: ")
        conn.close()


def output_tok_s(path: Path) -> float:
    return json.loads(path.read_text())["endpoints"][0]["results"][0]["output_tok_s"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=2, help="closed/open pairs of runs (default 2)")
    parser.add_argument("--model", default=None, help="served model (default: the embedded SmolLM2)")
    parser.add_argument("--quant", default="none")
    parser.add_argument("--out", type=Path, help="default: results/DATE-engine-view/engine_view.json")
    args = parser.parse_args()
    flags = ["--quant", args.quant, "--max-batch", "8"] + (["--model", args.model] if args.model else [])
    command = ServerCommand("qwen-serve", [sys.executable, "-m", "qwen_serve", "--port", "{port}", *flags])
    closed: list[float] = []
    opened: list[dict] = []
    with RunningServer(command) as server, tempfile.TemporaryDirectory() as tmp:
        for pair in range(args.pairs):
            for watched in (False, True) if pair % 2 == 0 else (True, False):
                if not watched:
                    closed.append(output_tok_s(run_bench("closed", server.url, Path(tmp), f"closed{pair}", BENCH,
                                                         "engine view closed")))
                    continue
                with Watcher(server.port) as watcher:
                    tok_s = output_tok_s(run_bench("open", server.url, Path(tmp), f"open{pair}", BENCH,
                                                   "engine view open"))
                opened.append({"output_tok_s": tok_s, "bytes_per_s": watcher.bytes / watcher.seconds,
                               "frames_per_s": watcher.frames / watcher.seconds, "seconds": watcher.seconds})
        time.sleep(12)  # past the 10 s tokens/s window: nothing changes any more
        with Watcher(server.port) as idle:
            time.sleep(20)
    ratio = statistics.median(o["output_tok_s"] for o in opened) / statistics.median(closed)
    machine = describe_machine(measure_bandwidth=False)
    document = {"machine": machine, "server": command.argv, "bench": BENCH, "closed_tok_s": closed, "open": opened,
                "open_over_closed": ratio, "idle_bytes_per_s": idle.bytes / idle.seconds,
                "created": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
    out = args.out or result_folder("engine-view") / "engine_view.json"
    out.write_text(json.dumps(document, indent=2) + "\n")
    print(machine_header(machine))
    for pair, (c, o) in enumerate(zip(closed, opened)):
        print(f"pair {pair}: closed {c:6.1f} tok/s   open {o['output_tok_s']:6.1f} tok/s   stream "
              f"{o['bytes_per_s'] / 1024:5.1f} KiB/s, {o['frames_per_s']:.1f} frames/s")
    print(f"open / closed (medians): {ratio:.3f}; idle stream {document['idle_bytes_per_s']:.0f} B/s; wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
