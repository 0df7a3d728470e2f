"""Serving under overload, against a real server process (not run by CI).

    python benchmarks/load.py                       # both measurements, about 5 minutes
    python benchmarks/load.py --only overload       # or: priority
    python benchmarks/load.py --model PATH          # default: the embedded SmolLM2-135M

overload  4 x (max_batch + max_queue) closed-loop streaming clients for --seconds: counts of
          each status (5xx must be 0, every 429 must carry Retry-After), TTFT and end-to-end
          latency of the admitted requests, output tokens/s, and KV blocks back to the
          cached-only baseline afterwards.
priority  2 x max_batch closed-loop clients (twice what the batch holds, so a queue always
          waits), a quarter of them high priority: TTFT p50/p95 of high and low requests under
          --scheduling-policy fcfs and priority, side by side. Under fcfs no priority field is
          sent (it would be refused); the label only sorts the measurements.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import sys
import time
import uuid
from pathlib import Path

import aiohttp

sys.path.insert(0, str(Path(__file__).parent))
from load_clients import Outcome, stream_chat  # noqa: E402

from qwen_serve.bench.machine import machine_header  # noqa: E402
from qwen_serve.bench.stats import percentiles  # noqa: E402
from qwen_serve.conformance.server_process import ServerProcess  # noqa: E402


def prompt(words: int = 20) -> list[dict]:
    """A fresh prompt (no prefix-cache hit) of about 1.3 tokens a word plus the template."""
    return [{"role": "user", "content": f"{uuid.uuid4().hex}: " + " ".join(["describe the sea"] * (words // 3))}]


async def closed_loop(url: str, clients: int, seconds: float, body_for) -> list[Outcome]:
    """clients concurrent loops, each sending its next request when the last one ends, for seconds."""
    outcomes: list[Outcome] = []
    deadline = time.monotonic() + seconds
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        async def loop(i: int) -> None:
            while time.monotonic() < deadline:
                body, label = body_for(i)
                outcome = await stream_chat(session, url, body, label)
                outcomes.append(outcome)
                if outcome.status == 429:
                    await asyncio.sleep(0.05)  # a quick retry keeps the pressure on (not Retry-After)
        await asyncio.gather(*(loop(i) for i in range(clients)))
    return outcomes


def start(model: str | None, *args: str) -> ServerProcess:
    return ServerProcess([*(["--model", model] if model else []), *args]).start()


def overload(model: str | None, max_batch: int, max_queue: int, seconds: float, max_tokens: int) -> None:
    clients = 4 * (max_batch + max_queue)
    server = start(model, "--max-batch", str(max_batch), "--max-queue", str(max_queue))
    try:
        baseline = server.wait_until_idle()
        body = {"messages": prompt(), "max_tokens": max_tokens}
        t = time.monotonic()
        outcomes = asyncio.run(closed_loop(server.url, clients, seconds, lambda i: (
            {**body, "messages": prompt()}, "")))
        wall = time.monotonic() - t
        after = server.wait_until_idle(timeout_s=60)
    finally:
        server.stop()
    statuses = collections.Counter(o.status for o in outcomes)
    served = [o for o in outcomes if o.status == 200]
    refused = [o for o in outcomes if o.status == 429]
    print(f"\noverload: {clients} clients on --max-batch {max_batch} --max-queue {max_queue}, {wall:.0f} s, "
          f"max_tokens {max_tokens}")
    print(f"  statuses: {dict(sorted(statuses.items()))}; 5xx: {sum(n for s, n in statuses.items() if s >= 500)}; "
          f"429 without Retry-After: {sum(1 for o in refused if not o.retry_after)}")
    print(f"  admitted: {len(served)}, completed with {max_tokens} tokens: "
          f"{sum(1 for o in served if o.completion_tokens == max_tokens)}")
    ttft = [o.ttft_s for o in served if o.ttft_s is not None]
    e2e = [o.e2e_s for o in served]
    print(f"  TTFT {p50_p95(ttft)}; end-to-end {p50_p95(e2e)}; "
          f"{sum(o.completion_tokens for o in served) / wall:.1f} output tok/s")
    print(f"  KV blocks used before {baseline['kv_blocks_used']} (cached {baseline['kv_blocks_cached']}), after "
          f"{after['kv_blocks_used']} (cached {after['kv_blocks_cached']})")


def priority(model: str | None, max_batch: int, seconds: float, max_tokens: int) -> None:
    clients = 2 * max_batch
    high_clients = max(1, clients // 4)
    print(f"\npriority: {clients} clients ({high_clients} high priority) on --max-batch {max_batch}, "
          f"{seconds:.0f} s per policy, max_tokens {max_tokens}")
    print(f"  {'policy':9s} {'class':5s} {'requests':>8s} {'TTFT p50 s':>11s} {'TTFT p95 s':>11s}")
    for policy in ("fcfs", "priority"):
        server = start(model, "--max-batch", str(max_batch), "--scheduling-policy", policy)

        def body_for(i: int) -> tuple[dict, str]:
            label = "high" if i < high_clients else "low"
            body = {"messages": prompt(), "max_tokens": max_tokens}
            if policy == "priority":
                body["priority"] = 0 if label == "high" else 10
            return body, label

        try:
            outcomes = asyncio.run(closed_loop(server.url, clients, seconds, body_for))
        finally:
            server.stop()
        assert all(o.status == 200 for o in outcomes), collections.Counter(o.status for o in outcomes)
        for label in ("high", "low"):
            ttft = [o.ttft_s for o in outcomes if o.label == label and o.ttft_s is not None]
            p = percentiles(ttft, (50, 95))
            print(f"  {policy:9s} {label:5s} {len(ttft):8d} {in_seconds(p['p50']):>11s} {in_seconds(p['p95']):>11s}", flush=True)


def in_seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def p50_p95(samples: list[float]) -> str:
    p = percentiles(samples, (50, 95))
    return f"p50 {in_seconds(p['p50'])} s, p95 {in_seconds(p['p95'])} s"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--only", choices=("overload", "priority"), default=None)
    p.add_argument("--max-batch", type=int, default=4)
    p.add_argument("--max-queue", type=int, default=8)
    p.add_argument("--seconds", type=float, default=60.0)
    p.add_argument("--max-tokens", type=int, default=32)
    args = p.parse_args()
    print(machine_header())
    if args.only in (None, "overload"):
        overload(args.model, args.max_batch, args.max_queue, args.seconds, args.max_tokens)
    if args.only in (None, "priority"):
        priority(args.model, args.max_batch, args.seconds, args.max_tokens)


if __name__ == "__main__":
    main()
