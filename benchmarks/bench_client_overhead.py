"""What the benchmark client itself costs per streamed chunk: `qwen-serve bench`'s aiohttp client
(qwen_serve.bench.client) against the openai client's streaming iterator, on the same canned SSE
stream from a local server process that sends chat chunks as fast as it can.

    flock /work/cpu.lock python benchmarks/bench_client_overhead.py

On a 2-core machine the client's CPU comes out of the server's, so the client with the lower
CPU time per chunk is the one to measure with. Prints client CPU microseconds per chunk (user +
system of this process) and wall time, 1 and 8 streams at once.
"""
from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import time

CHUNKS, REQUESTS = 512, 16


def serve(port: int) -> None:
    from aiohttp import web

    def event(i: int) -> bytes:
        body = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "m",
                "choices": [{"index": 0, "delta": {"content": f" w{i}"}, "finish_reason": None}]}
        return b"data: " + json.dumps(body, separators=(",", ":")).encode() + b"\n\n"

    events = [event(i) for i in range(CHUNKS)]
    last = {"id": "chatcmpl-x", "object": "chat.completion.chunk", "created": 0, "model": "m",
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            "usage": {"prompt_tokens": 8, "completion_tokens": CHUNKS, "total_tokens": CHUNKS + 8}}

    async def chat(request: web.Request) -> web.StreamResponse:
        await request.read()
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for e in events:
            await response.write(e)
        await response.write(b"data: " + json.dumps(last).encode() + b"\n\ndata: [DONE]\n\n")
        return response

    async def models(request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "m", "object": "model"}]})

    app = web.Application()
    app.router.add_post("/v1/chat/completions", chat)
    app.router.add_get("/v1/models", models)
    web.run_app(app, host="127.0.0.1", port=port, print=None)


async def with_aiohttp(url: str, streams: int) -> int:
    import aiohttp

    from qwen_serve.bench.client import Target, stream_one
    from qwen_serve.bench.stats import RequestRecord

    target = Target(url, "chat", "m")
    async with aiohttp.ClientSession() as session:
        async def one(_):
            return await stream_one(session, target, "hi", RequestRecord(8, CHUNKS))

        records = []
        for start in range(0, REQUESTS, streams):
            records += await asyncio.gather(*map(one, range(start, min(start + streams, REQUESTS))))
    assert all(r.ok and len(r.chunk_times) == CHUNKS for r in records), records[0].error
    return sum(len(r.chunk_times) for r in records)


async def with_openai(url: str, streams: int) -> int:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)

    async def one(_):
        times = []
        stream = await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}],
                                                      max_tokens=CHUNKS, stream=True,
                                                      stream_options={"include_usage": True})
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                times.append(time.perf_counter())
        return len(times)

    counts = []
    for start in range(0, REQUESTS, streams):
        counts += await asyncio.gather(*map(one, range(start, min(start + streams, REQUESTS))))
    await client.close()
    assert all(c == CHUNKS for c in counts), counts
    return sum(counts)


def main() -> int:
    from qwen_serve.bench.launcher import free_port
    from qwen_serve.bench.machine import machine_header

    if len(sys.argv) == 3 and sys.argv[1] == "--serve":
        serve(int(sys.argv[2]))
        return 0
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", str(port)])
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(100):
            try:
                import urllib.request

                urllib.request.urlopen(url + "/v1/models", timeout=1).close()
                break
            except OSError:
                time.sleep(0.1)
        print(machine_header())
        print(f"{REQUESTS} requests x {CHUNKS} chunks each; client CPU per chunk (this process), best of 3")
        print(f"{'client':28s} {'streams':>7s} {'us CPU/chunk':>13s} {'wall s':>7s}")
        for name, client in (("qwen-serve bench (aiohttp)", with_aiohttp), ("openai AsyncOpenAI", with_openai)):
            for streams in (1, 8):
                best_cpu, best_wall = float("inf"), float("inf")
                for _ in range(3):
                    cpu, wall = time.process_time(), time.perf_counter()
                    chunks = asyncio.run(client(url, streams))
                    best_cpu = min(best_cpu, (time.process_time() - cpu) / chunks)
                    best_wall = min(best_wall, time.perf_counter() - wall)
                print(f"{name:28s} {streams:7d} {best_cpu * 1e6:13.1f} {best_wall:7.2f}", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
