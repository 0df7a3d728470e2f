"""The same qwen-serve build over HTTP (`qwen-serve bench` against the server) and in-process
(the engine `LLM(...).generate` drives, stepped here so every token gets a timestamp), same
prompt and output lengths, batch 1, 8 and 16, side by side in one run: what the server costs.

    flock /work/cpu.lock python benchmarks/bench_http_vs_inprocess.py            # int4, ~5 min
    flock /work/cpu.lock python benchmarks/bench_http_vs_inprocess.py --quant none --dtype bfloat16
    flock /work/cpu.lock python benchmarks/bench_http_vs_inprocess.py --model DIR --batches 1 --label hybrid-2b

--model serves another checkpoint directory (default: setup_peers.py's random Qwen3-0.6B).

Writes benchmarks/results/DATE-http-vs-inprocess[-QUANT-DTYPE]/http_vs_inprocess*.json (+ .md,
PNGs, the HTTP run's own JSON in raw/) in the bench's format: one
"endpoint" per path. Output tok/s = output tokens / wall time of a repetition, prefill included,
for both paths; medians of 3 repetitions.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from result_folder import result_folder
from servers import REPO, RunningServer, ServerCommand, run_bench
from setup_peers import Peers, make_checkpoint

from qwen_serve.bench.machine import describe_machine, source_commit
from qwen_serve.bench.plots import write_plots
from qwen_serve.bench.prompts import TokenIdPrompts
from qwen_serve.bench.report import merge, new_document, write_json
from qwen_serve.bench.stats import RequestRecord, repetition, summarize
from qwen_serve.cache_dir import cache_dir

PROMPT_TOKENS, OUTPUT_TOKENS, BATCHES, REPETITIONS = 64, 128, (1, 8, 16), 3


def in_process(model: str, quant: str, dtype: str, batches: tuple[int, ...]) -> dict:
    from qwen_serve import LLM, SamplingParams

    llm = LLM(model, quant=quant, dtype=dtype)
    engine = llm.engine
    prompts = TokenIdPrompts(seed=1)
    params = SamplingParams(max_tokens=OUTPUT_TOKENS, ignore_eos=True)
    results = []
    engine.run([("warm-up", prompts.make(PROMPT_TOKENS), SamplingParams(max_tokens=16, ignore_eos=True))])
    for batch in batches:
        reps, records = [], []
        for rep in range(REPETITIONS):
            start = time.perf_counter()
            ids = [f"inproc-{batch}-{rep}-{i}" for i in range(batch)]
            seqs = [engine.add_request(rid, prompts.make(PROMPT_TOKENS), params) for rid in ids]
            recs = {rid: RequestRecord(PROMPT_TOKENS, OUTPUT_TOKENS, sent=start) for rid in ids}
            while any(not s.is_finished for s in seqs):
                outputs = engine.step()
                now = time.perf_counter() - start
                for out in outputs:
                    recs[out.request_id].chunk_times.extend([now] * len(out.new_token_ids))
            wall = time.perf_counter() - start
            for seq in seqs:
                recs[seq.request_id].prompt_tokens = len(seq.prompt_token_ids)
                recs[seq.request_id].output_tokens = len(seq.output_token_ids)
            reps.append(repetition(list(recs.values()), wall))
            records.extend(recs.values())
        results.append(summarize({"prompt_tokens": PROMPT_TOKENS, "output_tokens": OUTPUT_TOKENS,
                                  "concurrency": batch}, reps, records))
    return {"name": f"in-process {quant} {dtype}", "url": None, "model": model, "api": "LLM engine",
            "notes": f"qwen-serve {source_commit()}; LLM({model!r}, quant={quant!r}, dtype={dtype!r}), engine stepped "
                     "in this process",
            "identity": {}, "results": results}


def markdown(doc: dict, http: str, local: str, model: str, batches: tuple[int, ...]) -> str:
    def get(name, c, key):
        e = next(e for e in doc["endpoints"] if e["name"] == name)
        r = next(r for r in e["results"] if r["concurrency"] == c)
        return r[key]["p50"] if isinstance(r[key], dict) else r[key]

    cpu = doc["machine"]["cpu"]
    lines = ["# The same build over HTTP and in-process", "",
             f"`python benchmarks/bench_http_vs_inprocess.py`, {doc['created']}; CPU {cpu['model_name']} "
             f"({' '.join(cpu['key_flags'])}), {doc['machine']['memory_bandwidth']['read_gb_s']} GB/s; {model}. "
             f"{PROMPT_TOKENS}-token prompts, {OUTPUT_TOKENS} output tokens, medians of {REPETITIONS}.", "",
             "| batch | HTTP out tok/s | in-process out tok/s | in-process / HTTP | TTFT p50 HTTP / in-process | "
             "ITL p50 HTTP / in-process |", "|---|---|---|---|---|---|"]
    for c in batches:
        h, i = get(http, c, "output_tok_s"), get(local, c, "output_tok_s")
        lines.append(f"| {c} | {h:.1f} | {i:.1f} | {i / h:.2f}x | {get(http, c, 'ttft_s') * 1e3:.0f} / "
                     f"{get(local, c, 'ttft_s') * 1e3:.0f} ms | {get(http, c, 'itl_s') * 1e3:.1f} / "
                     f"{get(local, c, 'itl_s') * 1e3:.1f} ms |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quant", default="int4", choices=("int4", "none"))
    parser.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    parser.add_argument("--peers", type=Path, default=cache_dir("peers"), help="where setup_peers.py put the checkpoint")
    parser.add_argument("--model", type=Path, default=None, help="a checkpoint directory (default: the peers' Qwen3-0.6B)")
    parser.add_argument("--batches", type=int, nargs="+", default=list(BATCHES), help=f"default {BATCHES}")
    parser.add_argument("--label", default="", help="added to the result folder's and files' names")
    args = parser.parse_args(argv)
    batches = tuple(args.batches)
    if args.model is None:
        peers = Peers(args.peers.expanduser().resolve())
        make_checkpoint(peers)
        model = peers.checkpoint
    else:
        model = args.model.expanduser().resolve()
    stem = "http_vs_inprocess" + "".join(f"_{v}" for v, default in ((args.quant, "int4"), (args.dtype, "float32"),
                                                                      (args.label, "")) if v != default)
    folder = result_folder(stem.replace("_", "-"))
    raw = folder / "raw"
    http_name = f"HTTP {args.quant} {args.dtype}"
    command = ServerCommand(http_name, [sys.executable, "-m", "qwen_serve", "--model", str(model),
                                        "--quant", args.quant, "--dtype", args.dtype, "--host", "127.0.0.1",
                                        "--port", "{port}"])
    with RunningServer(command) as server:
        http_path = run_bench(http_name, server.url, raw, f"http_{args.quant}_{args.dtype}", [
            "--api", "chat", "--tokenizer", str(model), "--prompt-tokens", str(PROMPT_TOKENS),
            "--output-tokens", str(OUTPUT_TOKENS), "--concurrency", ",".join(map(str, batches)),
            "--repetitions", str(REPETITIONS)], f"qwen-serve {source_commit()}; {' '.join(server.argv)}")
    local = new_document(describe_machine(), {"points": "see results"}, [in_process(str(model), args.quant, args.dtype, batches)])
    doc = merge([json.loads(http_path.read_text()), local], [str(http_path.relative_to(REPO)), "in-process"])
    write_json(doc, folder / f"{stem}.json")
    write_plots(doc, folder, f"{stem}-")
    (folder / f"{stem}.md").write_text(markdown(doc, http_name, f"in-process {args.quant} {args.dtype}", model.name,
                                                batches))
    print((folder / f"{stem}.md").read_text())
    return 0


if __name__ == "__main__":
    sys.exit(main())
