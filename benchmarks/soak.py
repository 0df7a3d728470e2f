"""A soak of the server process: 1,000 requests, its resident memory at start and end (not run by CI).

    python benchmarks/soak.py                    # SmolLM2-135M, 1,000 requests, a few minutes
    python benchmarks/soak.py --requests 5000 --model PATH

The mix is what a busy server sees: streaming and non-streaming requests, fresh prompts and
prompts sharing a system prompt (prefix-cache hits), clients that hang up mid-stream, and
bursts past --max-queue (429s). The server's RSS is read (psutil) after a warm-up of
--warmup requests, which fills the KV pool (--kv-blocks, small so that its slabs are all
allocated by then), and every 100 requests after; the figure is end vs start. KV blocks must
come back to the cached-only baseline and the server must still answer.
"""
from __future__ import annotations

import argparse
import asyncio
import collections
import random
import sys
import time
import uuid
from pathlib import Path

import aiohttp
import psutil

sys.path.insert(0, str(Path(__file__).parent))
from load_clients import stream_chat  # noqa: E402

from qwen_serve.bench.machine import machine_header  # noqa: E402
from qwen_serve.conformance.server_process import ServerProcess  # noqa: E402

SYSTEM = {"role": "system", "content": " ".join(f"Rule {i}: answer briefly and politely." for i in range(12))}


def body(rng: random.Random) -> dict:
    user = {"role": "user", "content": f"{uuid.uuid4().hex} " + " ".join(["tell me about rivers"] * rng.randint(1, 6))}
    return {"messages": [SYSTEM, user] if rng.random() < 0.5 else [user], "max_tokens": rng.randint(4, 24),
            "temperature": rng.choice([0.0, 0.8]), "seed": rng.randint(0, 1000)}


async def one(session: aiohttp.ClientSession, url: str, rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.1:  # a client that hangs up after a moment
        try:
            await asyncio.wait_for(stream_chat(session, url, body(rng)), timeout=rng.uniform(0.05, 0.5))
            return "200"
        except asyncio.TimeoutError:
            return "hung up"
    if kind < 0.55:
        return str((await stream_chat(session, url, body(rng))).status)
    async with session.post(url + "/v1/chat/completions", json=body(rng)) as response:
        await response.read()
        return str(response.status)


async def run(url: str, count: int, concurrency: int, seed: int, on_progress) -> collections.Counter:
    rng = random.Random(seed)
    statuses: collections.Counter = collections.Counter()
    done = 0
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=600)) as session:
        while done < count:
            burst = concurrency * (3 if rng.random() < 0.1 else 1)  # now and then past --max-queue
            batch = min(burst, count - done)
            for status in await asyncio.gather(*(one(session, url, rng) for _ in range(batch))):
                statuses[status] += 1
            before, done = done, done + batch
            if done // 100 > before // 100:
                on_progress(done)
    return statuses


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None)
    p.add_argument("--requests", type=int, default=1000)
    p.add_argument("--warmup", type=int, default=100)
    p.add_argument("--concurrency", type=int, default=8)
    p.add_argument("--kv-blocks", type=int, default=96)
    p.add_argument("--margin", type=float, default=0.05, help="allowed RSS growth, as a fraction of the start")
    args = p.parse_args()
    print(machine_header())
    server = ServerProcess([*(["--model", args.model] if args.model else []), "--max-batch", "4", "--max-queue", "8",
                            "--kv-blocks", str(args.kv_blocks)]).start()
    try:
        proc = psutil.Process(server.proc.pid)
        mib = lambda: proc.memory_info().rss / 2**20  # noqa: E731
        print(f"RSS after load: {mib():.1f} MiB")
        asyncio.run(run(server.url, args.warmup, args.concurrency, 1, lambda n: None))
        server.wait_until_idle(timeout_s=60)
        start_mib, t = mib(), time.monotonic()
        print(f"RSS after {args.warmup} warm-up requests (the start): {start_mib:.1f} MiB")
        samples = []

        def progress(n: int) -> None:
            samples.append((n, mib()))
            print(f"  {n:6d} requests: RSS {samples[-1][1]:.1f} MiB", flush=True)

        statuses = asyncio.run(run(server.url, args.requests, args.concurrency, 2, progress))
        idle = server.wait_until_idle(timeout_s=60)
        end_mib = mib()
        server.assert_still_serving()
    finally:
        server.stop()
    growth = (end_mib - start_mib) / start_mib
    print(f"{args.requests} requests in {time.monotonic() - t:.0f} s: {dict(sorted(statuses.items()))}")
    print(f"KV blocks after: used {idle['kv_blocks_used']} = cached {idle['kv_blocks_cached']} "
          f"of {idle['kv_blocks_total']}")
    print(f"RSS start {start_mib:.1f} MiB, end {end_mib:.1f} MiB: {growth * 100:+.2f}% "
          f"({'within' if growth <= args.margin else 'OVER'} the {args.margin * 100:.0f}% margin)")
    sys.exit(0 if growth <= args.margin and idle["kv_blocks_used"] == idle["kv_blocks_cached"] else 1)


if __name__ == "__main__":
    main()
