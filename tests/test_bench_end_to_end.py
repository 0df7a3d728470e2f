"""`qwen-serve bench` once end to end against a real qwen-serve SmolLM2 server: exact prompt
lengths checked against usage, every level measured, occupancy sampled from /metrics, JSON and
PNG written. Small on purpose (a few seconds of generation); no figure is asserted on speed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest
from server_fixtures import smollm2_server  # noqa: F401 (fixture)

from qwen_serve.conformance.models import smollm2_gguf


@pytest.mark.parametrize("api", ["auto", "chat"])
def test_bench_against_a_real_server(smollm2_server, tmp_path, api):  # noqa: F811
    """auto picks /v1/completions with token-id prompts (the server counts them exactly); chat
    measures the template's own tokens and pads the user message to the same total."""
    out = subprocess.run(
        [sys.executable, "-m", "qwen_serve", "bench", "--endpoint", f"ours={smollm2_server.url}", "--api", api,
         "--concurrency", "1,2", "--prompt-tokens", "48", "--output-tokens", "6", "--repetitions", "2",
         "--tokenizer", str(smollm2_gguf()), "--sample-metrics", "0.02", "--note", "ours=SmolLM2 float32",
         "--out", str(tmp_path), "--name", "e2e", "--no-progress"],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    document = json.loads((tmp_path / "e2e.json").read_text())
    assert document["machine"]["cpu"]["flags"] and document["machine"]["memory_bandwidth"]["read_gb_s"] > 0
    (endpoint,) = document["endpoints"]
    assert endpoint["api"] == ("completions" if api == "auto" else "chat")
    assert endpoint["identity"]["/health"]["backend"] == "torch" and endpoint["notes"] == "SmolLM2 float32"
    assert (endpoint["chat_template_tokens"] > 0) == (api == "chat")
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


@pytest.mark.parametrize("interleave", [False, True])
def test_two_endpoints_in_turns_or_one_after_the_other(smollm2_server, tmp_path, interleave):  # noqa: F811
    """Two names for one server: one after the other, every repetition of the first comes before
    the second's; interleaved, each repetition takes turns and who goes first alternates."""
    out = subprocess.run(
        [sys.executable, "-m", "qwen_serve", "bench", "--endpoint", f"a={smollm2_server.url}",
         "--endpoint", f"b={smollm2_server.url}", "--concurrency", "1", "--prompt-tokens", "16",
         "--output-tokens", "3", "--repetitions", "3", "--warmup", "0", "--out", str(tmp_path), "--name", "turns",
         "--no-progress", "--no-plots", "--no-bandwidth", *(["--interleave"] if interleave else [])],
        capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    document = json.loads((tmp_path / "turns.json").read_text())
    assert document["settings"]["interleaved"] is interleave
    starts = sorted((rep["started_s"], endpoint["name"]) for endpoint in document["endpoints"]
                    for rep in endpoint["results"][0]["repetitions"])
    order = "".join(name for _, name in starts)
    assert order == ("abbaab" if interleave else "aaabbb"), starts
    for endpoint in document["endpoints"]:
        (r,) = endpoint["results"]
        assert r["failed"] == 0 and r["requests"] == 3 and r["output_tok_s"] > 0, r
    smollm2_server.wait_until_idle()
