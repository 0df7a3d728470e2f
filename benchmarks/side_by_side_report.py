"""The report of the side-by-side (side_by_side.py measures): every server's raw results merged
into one document, its plots, and the markdown table of ratios, each row saying whether its two
servers were measured in turns in one sitting."""
from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Sequence

from servers import RSS_SETTLE_S


def figure(document: dict, endpoint: str, key: str, concurrency: int, prompt: int = 64, output: int = 128):
    for e in document["endpoints"]:
        if e["name"] == endpoint:
            for r in e["results"]:
                if (r["prompt_tokens"], r["output_tokens"], r["concurrency"]) == (prompt, output, concurrency):
                    value = r[key]
                    return value["p50"] if isinstance(value, dict) else value
    return None


def _num(value, digits=1) -> str:
    return "—" if value is None else f"{value:,.{digits}f}"


def _ratio(a, b) -> str:
    return "—" if a is None or b is None or b == 0 else f"{a / b:.2f}x"


def _bandwidth(values: list) -> str:
    values = [v for v in values if v]
    if not values:
        return "—"
    return f"{statistics.median(values):.1f} (median; {min(values):.1f}–{max(values):.1f})"


def torch_bandwidth_gb_s() -> float:
    """The issue's method: torch sum of a 512 MiB float32 tensor on every core, best of 7."""
    import torch

    torch.set_num_threads(os.cpu_count() or 1)
    x = torch.ones(2**27)
    best = 0.0
    for _ in range(7):
        start = time.perf_counter()
        x.sum()
        best = max(best, x.numel() * 4 / (time.perf_counter() - start))
    return best / 1e9


def report(servers: Sequence[str], folder: Path, name: str = "side_by_side") -> None:
    """Merge folder/raw/SERVER.json of the `servers` measured (in that order) into
    folder/NAME.json, its PNGs and folder/NAME.md."""
    raw_dir = folder / "raw"
    raw = sorted(p for p in raw_dir.glob("*.json") if p.stem in servers)
    if not raw:
        raise SystemExit(f"nothing measured in {raw_dir} yet: run with --only SERVER first")
    order = {server: i for i, server in enumerate(servers)}
    raw.sort(key=lambda p: order[p.stem])
    subprocess.run([sys.executable, "-m", "qwen_serve", "bench", "--merge", *map(str, raw), "--out", str(folder),
                    "--name", name], check=True)
    document = json.loads((folder / f"{name}.json").read_text())
    (folder / f"{name}.md").write_text(markdown(document, torch_bandwidth_gb_s(), name))
    print(f"wrote {folder / f'{name}.md'}")


def _sitting(endpoint: dict) -> str | None:
    """The in-turns sitting an endpoint's figures come from, or None if it was measured alone."""
    return (endpoint.get("in_turns") or {}).get("started")


def _how_run(doc: dict) -> str:
    """Which servers' figures come from one in-turns sitting, and which were measured alone."""
    sittings: dict[str, list[str]] = {}
    for e in doc["endpoints"]:
        sittings.setdefault(_sitting(e) or "", []).append(e["name"])
    parts = [f"in turns at {key}: {', '.join(names)}" for key, names in sittings.items() if key]
    if sittings.get(""):
        parts.append(f"one at a time: {', '.join(sittings[''])}")
    return "; ".join(parts)


def markdown(doc: dict, torch_gb_s: float, name: str = "side_by_side") -> str:
    def f(e, c, key="output_tok_s"):
        return figure(doc, e, key, c)

    def prefill(e, key="input_tok_s"):
        return figure(doc, e, key, 1, 512, 1)

    sittings = {e["name"]: _sitting(e) for e in doc["endpoints"]}

    def together(a, b) -> str:
        return "in turns" if sittings.get(a) and sittings.get(a) == sittings.get(b) else "apart"

    cpu = doc["machine"]["cpu"]
    # one reading per bench run: servers measured in turns share theirs
    bw = list({_sitting(e) or e["name"]: e["machine"].get("memory_bandwidth", {}).get("read_gb_s")
               for e in doc["endpoints"]}.values())
    rows = [
        ("single-stream decode, int4 vs Q4_0", "qwen-int4", "llama-q4_0", 1),
        ("8 concurrent streams, int4 vs Q4_0", "qwen-int4", "llama-q4_0", 8),
        ("16 concurrent streams, int4 vs Q4_0", "qwen-int4", "llama-q4_0", 16),
        ("single-stream decode, fp32 vs BF16", "qwen-fp32", "llama-bf16", 1),
        ("single-stream decode, bf16 vs BF16", "qwen-bf16", "llama-bf16", 1),
        ("8 concurrent, fp32 vs BF16", "qwen-fp32", "llama-bf16", 8),
        ("8 concurrent, bf16 vs BF16", "qwen-bf16", "llama-bf16", 8),
        ("single-stream decode, int4 vs vLLM bf16", "qwen-int4", "vllm-bf16", 1),
        ("8 concurrent, int4 vs vLLM bf16", "qwen-int4", "vllm-bf16", 8),
        ("16 concurrent, int4 vs vLLM bf16", "qwen-int4", "vllm-bf16", 16),
        ("single-stream decode, bf16 vs vLLM bf16", "qwen-bf16", "vllm-bf16", 1),
        ("8 concurrent, bf16 vs vLLM bf16", "qwen-bf16", "vllm-bf16", 8),
    ]
    lines = [
        "# Side-by-side: qwen-serve, llama.cpp server, vLLM CPU",
        "",
        f"Measured {doc['created']} with `python benchmarks/side_by_side.py` ({_how_run(doc)}; "
        "`qwen-serve bench` as the one client: chat completions, streaming, 64-token prompts, 128 output tokens "
        "with ignore_eos, medians of 3 repetitions; prefill: one 512-token prompt, 1 output token).",
        "",
        f"CPU: {cpu['model_name']} (family {cpu['family']} model {cpu['model']}), {cpu['usable_cpus']} usable CPUs; "
        f"flags that pick kernels: {' '.join(cpu['key_flags']) or 'none'}. Memory read bandwidth "
        f"{_bandwidth(bw)} GB/s (numpy, measured by `qwen-serve bench` at the start of each bench run, the "
        f"servers up and idle), {torch_gb_s:.1f} GB/s by the issue's method (torch sum, {os.cpu_count()} threads).",
        "",
        "Output tok/s = all output tokens of a repetition / its wall time (prefill included); prefill tok/s = "
        "prompt tokens / wall time with 1 output token.",
        "",
        "A ratio is worth something only between servers measured in turns in one sitting; `apart` marks the rows "
        "whose two servers were not.",
        "",
        "| figure | qwen-serve | peer | ratio | measured |",
        "|---|---|---|---|---|",
    ]
    for label, ours, peer, c in rows:
        lines.append(f"| {label} | {_num(f(ours, c))} tok/s | {_num(f(peer, c))} tok/s | {_ratio(f(ours, c), f(peer, c))} "
                     f"| {together(ours, peer)} |")
    for ours, peer in (("qwen-int4", "llama-q4_0"), ("qwen-int4", "vllm-bf16"), ("qwen-bf16", "llama-bf16"),
                       ("qwen-bf16", "vllm-bf16")):
        lines.append(f"| 512-token prefill, {ours[5:]} vs {peer} | {_num(prefill(ours), 0)} tok/s | "
                     f"{_num(prefill(peer), 0)} tok/s | {_ratio(prefill(ours), prefill(peer))} "
                     f"| {together(ours, peer)} |")
    for c in (1, 8):
        for peer in ("llama-q4_0", "vllm-bf16"):
            ours_s, peer_s = figure(doc, "qwen-int4", "ttft_s", c), figure(doc, peer, "ttft_s", c)
            lines.append(f"| TTFT p50 at {c} stream{'s' if c > 1 else ''}, int4 vs {peer} (lower is better) | "
                         f"{_num(ours_s, 3)} s | {_num(peer_s, 3)} s | {_ratio(ours_s, peer_s)} | "
                         f"{together('qwen-int4', peer)} |")
    lines.append(f"| TTFT of the 512-token prompt, int4 vs vllm-bf16 (lower is better) | {_num(prefill('qwen-int4', 'ttft_s'), 3)} s | "
                 f"{_num(prefill('vllm-bf16', 'ttft_s'), 3)} s | {_ratio(prefill('qwen-int4', 'ttft_s'), prefill('vllm-bf16', 'ttft_s'))} "
                 f"| {together('qwen-int4', 'vllm-bf16')} |")
    lines += ["", "Every server's figures (output tok/s at 1 / 8 / 16 streams; per-stream decode = 1 / median time per "
              "output token at 1 stream; TTFT p50 of the 64-token prompt at 1 stream; "
              f"resident memory after its run, idle for {RSS_SETTLE_S:.0f} s):", "",
              "| server | c=1 | c=8 | c=16 | per-stream decode c=1 | TTFT c=1 | prefill 512 | TTFT 512 | RSS after |",
              "|---|---|---|---|---|---|---|---|---|"]
    for e in doc["endpoints"]:
        n = e["name"]
        ttft1 = figure(doc, n, "ttft_s", 1)
        lines.append(f"| {n} | {_num(f(n, 1))} | {_num(f(n, 8))} | {_num(f(n, 16))} | "
                     f"{_num(f(n, 1, 'decode_tok_s_per_stream'))} | {_num(ttft1 and ttft1 * 1e3, 0)} ms | "
                     f"{_num(prefill(n), 0)} tok/s | {_num(prefill(n, 'ttft_s'), 3)} s | "
                     f"{_num(e.get('resident_mib_after'), 0)} MiB |")
    honoured = {e["name"]: min(r["output_length_honoured"] for r in e["results"] if r["output_tokens"] != 1)
                for e in doc["endpoints"]}
    lines += ["", "Share of decode requests that produced exactly the 128 tokens asked: "
              + ", ".join(f"{n} {v:.0%}" for n, v in honoured.items()) + ".", "",
              f"Plots: `{name}-throughput.png`, `{name}-latency.png`. Each server's exact command line "
              f"and version are in `{name}.json` (`notes`, `launches`).", ""]
    return "\n".join(lines)
