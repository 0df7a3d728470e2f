"""Qwen3-30B-A3B's geometry (hidden 2048, 32 q / 4 kv heads x 128, 128 experts of 768 with 8
routed, vocabulary 151,936, untied head) with random weights, written as one GGUF Q4_0 file
straight from random Q4_0 blocks (never a float model: conformance.gguf_writer.write_random_gguf),
then served from that same file by qwen-serve (--quant int4) and by llama.cpp's server, one at a
time, each measured by `qwen-serve bench`: decode of 128 tokens after 64-token prompts at 1, 4
and 8 streams, a 512-token prefill (prefill tok/s and TTFT), resident memory after the load and at
its peak. Not run by CI.

    python benchmarks/setup_peers.py --only llama                       # once: llama.cpp's server
    flock /work/cpu.lock python benchmarks/bench_moe.py --layers 12     # 12 of the 48 layers
    flock /work/cpu.lock python benchmarks/bench_moe.py                 # the whole model (~17 GB file)
    flock /work/cpu.lock python benchmarks/bench_moe.py --layers 12 --turns 3   # one stream, in turns

--turns N measures only one stream's decode, each server started afresh in N turns (who goes
first alternates): this machine's memory changes speed for minutes at a time.

--layers N keeps every layer's real geometry and scales only their number (the file, the weights
and the time per token shrink about N/48; the embedding and the head stay whole). The bound
printed beside the figures is the active bytes one decoded token reads (qwen-serve's start-up
plan) over the machine's measured read bandwidth. Routing is random, so each token's experts are
spread as a trained model's are at best: the bytes per step of several streams are a worst case.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from result_folder import dated_folder
from servers import RunningServer, ServerCommand, bench_running, combine_launches, one_stream_turns
from setup_peers import Peers

from qwen_serve.bench.machine import describe_machine, machine_header
from qwen_serve.cache_dir import cache_dir
from qwen_serve.conformance.gguf_writer import write_random_gguf
from qwen_serve.conformance.models import QWEN3_CHAT_TEMPLATE
from qwen_serve.conformance.qwen_tokenizer import qwen_tokenizer_json_path

QWEN3_30B_A3B = {
    "architectures": ["Qwen3MoeForCausalLM"], "hidden_size": 2048, "num_attention_heads": 32,
    "num_key_value_heads": 4, "head_dim": 128, "num_hidden_layers": 48, "num_experts": 128,
    "num_experts_per_tok": 8, "moe_intermediate_size": 768, "intermediate_size": 6144, "norm_topk_prob": True,
    "vocab_size": 151936, "max_position_embeddings": 40960, "rope_theta": 1_000_000.0, "rms_norm_eps": 1e-6,
    "tie_word_embeddings": False, "bos_token_id": 151643, "eos_token_id": 151645,
}
CONCURRENCY = (1, 4, 8)
COMMON = ["--api", "chat", "--repetitions", "3", "--warmup", "1"]
STAGES = [(["--prompt-tokens", "64", "--output-tokens", "128", "--concurrency", str(c)], c) for c in CONCURRENCY] \
    + [(["--prefill"], 1)]
CONTEXT_PER_SLOT = 1024
THREADS = "2"


def model_file(peers: Peers, layers: int) -> Path:
    """The random GGUF for `layers` layers, written once (the tokenizer beside it)."""
    path = peers.root / f"qwen3-30b-a3b-random-{layers}l-q4_0.gguf"
    tokenizer = peers.root / "qwen-tokenizer"
    tokenizer.mkdir(parents=True, exist_ok=True)
    (tokenizer / "tokenizer.json").write_bytes(qwen_tokenizer_json_path().read_bytes())
    (tokenizer / "tokenizer_config.json").write_text(json.dumps({"chat_template": QWEN3_CHAT_TEMPLATE}))
    if not path.exists():
        started = time.monotonic()
        partial = path.with_suffix(".partial")
        write_random_gguf({**QWEN3_30B_A3B, "num_hidden_layers": layers}, tokenizer, partial)
        partial.rename(path)
        print(f"wrote {path} ({path.stat().st_size / 2**30:.2f} GiB) in {time.monotonic() - started:.0f} s", flush=True)
    return path


def server_command(name: str, peers: Peers, gguf: Path, slots: int) -> ServerCommand:
    if name == "qwen-int4":
        return ServerCommand(name, [sys.executable, "-m", "qwen_serve", "--model", str(gguf), "--quant", "int4",
                                    "--max-batch", "8", "--kv-blocks", "1024", "--host", "127.0.0.1",
                                    "--port", "{port}"], startup_timeout_s=3600)
    return ServerCommand(name, [str(peers.llama_bin("llama-server")), "-m", str(gguf), "--host", "127.0.0.1",
                                "--port", "{port}", "-np", str(slots), "-c", str(CONTEXT_PER_SLOT * slots),
                                "-t", THREADS, "-tb", THREADS, "--metrics"], startup_timeout_s=1200)


def peak_resident_mib(server: RunningServer) -> float:
    """The server process's high-water resident memory (VmHWM), in MiB."""
    for line in Path(f"/proc/{server.proc.pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def measure(name: str, peers: Peers, gguf: Path, tokenizer: Path, raw: Path) -> Path:
    """llama.cpp restarted per stage with -np set to its streams; qwen-serve started once."""
    raw.mkdir(parents=True, exist_ok=True)
    launches = [(slots, [args]) for args, slots in STAGES] if name.startswith("llama") \
        else [(8, [args for args, _ in STAGES])]
    paths, notes = [], {}
    for slots, runs in launches:
        with RunningServer(server_command(name, peers, gguf, slots)) as server:
            notes.setdefault("startup_s", round(server.startup_s, 1))
            for bench_args in runs:
                path = bench_running(server, raw, f"{name}.{len(paths)}",
                                     [*COMMON, "--tokenizer", str(tokenizer), *bench_args])
                document = json.loads(path.read_text())
                document["endpoints"][0]["peak_resident_mib"] = round(peak_resident_mib(server), 1)
                path.write_text(json.dumps(document, indent=1) + "\n")
                paths.append(path)
    out = combine_launches(paths, raw / f"{name}.json")
    document = json.loads(out.read_text())
    document["endpoints"][0]["peak_resident_mib"] = max(
        json.loads(p.read_text())["endpoints"][0]["peak_resident_mib"] for p in paths)
    document["endpoints"][0]["startup_s"] = notes["startup_s"]
    out.write_text(json.dumps(document, indent=1) + "\n")
    for p in paths:
        p.unlink()
    return out


def active_bytes_per_token(layers: int) -> int:
    """What one decoded token reads at int4 (4.5 bits a weight: the codes, a float16 scale and
    zero per 64): attention and the 8 routed experts of every layer, the router in float32, one
    embedding row, and the whole head in int6 (6.25 bits: the torch backend's head where VNNI
    runs; int8 rows elsewhere read more)."""
    c = {**QWEN3_30B_A3B, "num_hidden_layers": layers}
    h, q, kv = c["hidden_size"], c["num_attention_heads"] * c["head_dim"], c["num_key_value_heads"] * c["head_dim"]
    per_layer = (2 * h * q + 2 * h * kv + c["num_experts_per_tok"] * 3 * h * c["moe_intermediate_size"]) * 4.5 / 8 \
        + c["num_experts"] * h * 4
    return int(layers * per_layer + h * 4.5 / 8 + c["vocab_size"] * h * 6.25 / 8)


def _num(value, digits: int = 1) -> str:
    return "-" if value is None else f"{value:,.{digits}f}"


def summary(documents: dict[str, dict], layers: int, bandwidth_gb_s: float | None) -> str:
    bound = active_bytes_per_token(layers)
    lines = [f"Qwen3-30B-A3B geometry, {layers} of 48 layers, random weights, one GGUF Q4_0 file",
             f"active bytes per decoded token (int4, int6 head): {bound / 2**30:.3f} GiB"
             + (f"; bandwidth bound at {bandwidth_gb_s} GB/s: {bandwidth_gb_s * 1e9 / bound:.1f} tok/s"
                if bandwidth_gb_s else ""), "",
             "| server | decode 1 | decode 4 | decode 8 | prefill 512 tok/s | TTFT 512 s | RSS after MiB | peak RSS MiB | start s |",
             "|---|---|---|---|---|---|---|---|---|"]
    for name, document in documents.items():
        endpoint = document["endpoints"][0]
        by_point = {(r["prompt_tokens"], r["output_tokens"], r["concurrency"]): r for r in endpoint["results"]}
        decode = [by_point.get((64, 128, c), {}).get("output_tok_s") for c in CONCURRENCY]
        prefill = by_point.get((512, 1, 1), {})
        cells = [_num(v, 2) for v in decode] + [_num(prefill.get("input_tok_s")),
                                               _num(prefill.get("ttft_s", {}).get("p50"), 2),
                                               _num(endpoint.get("resident_mib_after"), 0),
                                               _num(endpoint.get("peak_resident_mib"), 0), _num(endpoint.get("startup_s"), 0)]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--layers", type=int, default=48, help="decoder layers of the real geometry (48: all)")
    parser.add_argument("--only", action="append", choices=("qwen-int4", "llama-q4_0"), help="measure only these")
    parser.add_argument("--peers", type=Path, default=cache_dir("peers"))
    parser.add_argument("--out", type=Path, default=None, help="folder (default results/DATE-moe-NL)")
    parser.add_argument("--turns", type=int, default=0, help="only one stream's decode, in this many turns")
    args = parser.parse_args(argv)
    peers = Peers(args.peers.expanduser().resolve())
    folder = args.out or dated_folder(f"moe-{args.layers}l" + ("-turns" if args.turns else ""))
    machine = describe_machine(measure_bandwidth=True)
    header = machine_header(machine)
    print(header, flush=True)
    gguf = model_file(peers, args.layers)
    names = args.only or ["qwen-int4", "llama-q4_0"]
    if "llama-q4_0" in names and not peers.llama_bin("llama-server").exists():
        raise SystemExit("llama.cpp's server is not built: python benchmarks/setup_peers.py --only llama")
    tokenizer = peers.root / "qwen-tokenizer" / "tokenizer.json"
    if args.turns:
        table = one_stream_turns(names, args.turns, lambda name: server_command(name, peers, gguf, 1), folder / "raw",
                                 [*COMMON, "--tokenizer", str(tokenizer), *STAGES[0][0]], 64)
        report = header + "\n\n" + table
        (folder / "turns.md").write_text(report + "\n")
        print(report)
        return 0
    documents = {}
    for name in names:
        path = measure(name, peers, gguf, tokenizer, folder / "raw")
        documents[name] = json.loads(path.read_text())
    for existing in (folder / "raw").glob("*.json"):  # servers measured by an earlier --only run
        documents.setdefault(existing.stem, json.loads(existing.read_text()))
    report = header + "\n\n" + summary(documents, args.layers, machine.get("memory_bandwidth", {}).get("read_gb_s"))
    (folder / "moe.md").write_text(report + "\n")
    print(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
