"""Batch occupancy over time, sampled from the server's metrics while a level runs: how many
sequences run and wait. Reads qwen-serve's JSON /metrics, or Prometheus text under the names
vLLM (`vllm:num_requests_running`), llama.cpp (`llamacpp:requests_processing`) and qwen-serve's
Prometheus exposition use."""
from __future__ import annotations

import asyncio
import json
import time

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

RUNNING = ("num_requests_running", "requests_processing")
WAITING = ("num_requests_waiting", "requests_deferred")


def parse_occupancy(body: str) -> tuple[float, float] | None:
    """(running, waiting) from a metrics body, or None if it has neither form."""
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict) and "requests_active" in data and "queue_depth" in data:
        return float(data["requests_active"] - data["queue_depth"]), float(data["queue_depth"])
    found: dict[str, float] = {}
    try:
        for family in text_string_to_metric_families(body):
            short = family.name.rsplit(":", 1)[-1]
            for kind, names in (("running", RUNNING), ("waiting", WAITING)):
                if short in names and family.samples:
                    found[kind] = found.get(kind, 0.0) + sum(s.value for s in family.samples)
    except ValueError:
        return None
    if "running" not in found:
        return None
    return found["running"], found.get("waiting", 0.0)


class OccupancySampler:
    """Polls GET /metrics every `interval_s` until stopped; samples are (seconds, running, waiting)."""

    def __init__(self, session: aiohttp.ClientSession, url: str, interval_s: float, clock=time.perf_counter) -> None:
        self.session, self.url, self.interval_s, self.clock = session, url + "/metrics", interval_s, clock
        self.samples: list[tuple[float, float, float]] = []
        self.error: str | None = None
        self._task: asyncio.Task | None = None

    def start(self, origin: float) -> None:
        self._task = asyncio.create_task(self._poll(origin))

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            try:
                await self._task
            except asyncio.CancelledError:
                pass

    async def _poll(self, origin: float) -> None:
        while True:
            try:
                async with self.session.get(self.url, headers={"Accept": "application/json"}) as response:
                    body = await response.text()
                reading = parse_occupancy(body) if response.status == 200 else None
                if reading is None:
                    self.error = f"GET /metrics gave no running/waiting figures (HTTP {response.status})"
                    return
                self.samples.append((round(self.clock() - origin, 4), *reading))
            except aiohttp.ClientError as exc:
                self.error = f"GET /metrics failed: {exc}"
                return
            await asyncio.sleep(self.interval_s)
