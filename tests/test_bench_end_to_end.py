"""`qwen-serve bench` once end to end against a real qwen-serve SmolLM2 server: exact prompt
lengths checked against usage, every level measured, occupancy sampled from /metrics, JSON and
PNG written. Small on purpose (a few seconds of generation); no figure is asserted on speed."""
from __future__ import annotations

import json
import subprocess
import sys

from server_process import smollm2_server  # noqa: F401 (fixture)

from qwen_serve.conformance.models import smollm2_gguf


def test_bench_against_a_real_server(smollm2_server, tmp_path):  # noqa: F811
    out = subprocess.run(
        [sys.executable, "-m", "qwen_serve", "bench", "--endpoint", f"ours={smollm2_server.url}",
         "--concurrency", "1,2", "--prompt-tokens", "48", "--output-tokens", "6", "--repetitions", "2",
         "--tokenizer", str(smollm2_gguf()), "--sample-metrics", "0.02", "--note", "ours=SmolLM2 float32",
         "--out", str(tmp_path), "--name", "e2e", "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    document = json.loads((tmp_path / "e2e.json").read_text())
    assert document["machine"]["cpu"]["flags"] and document["machine"]["memory_bandwidth"]["read_gb_s"] > 0
    (endpoint,) = document["endpoints"]
    assert endpoint["api"] == "chat"  # today's server has no /v1/completions
    assert endpoint["identity"]["/health"]["backend"] == "torch" and endpoint["notes"] == "SmolLM2 float32"
    assert endpoint["chat_template_tokens"] > 0
    assert [r["concurrency"] for r in endpoint["results"]] == [1, 2]
    for r in endpoint["results"]:
        assert r["failed"] == 0 and r["requests"] == 2 * r["concurrency"], r
        assert r["prompt_tokens_seen"] == [48, 48], r  # the server's own count of every prompt
        assert 1 <= r["output_tokens_seen"][0] <= r["output_tokens_seen"][1] <= 6, r
        assert r["output_tok_s"] > 0 and r["ttft_s"]["p50"] > 0 and r["ttft_s"]["p50"] <= r["ttft_s"]["p99"]
        assert r["occupancy"]["samples"] and max(s[1] for s in r["occupancy"]["samples"]) <= r["concurrency"]
    assert max(s[1] for s in endpoint["results"][1]["occupancy"]["samples"]) == 2  # both streams ran together
    for name in ("e2e-throughput.png", "e2e-latency.png", "e2e-occupancy.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    assert "ours" in out.stdout and "TTFT" in out.stdout
    smollm2_server.wait_until_idle()  # every KV block back after the run
