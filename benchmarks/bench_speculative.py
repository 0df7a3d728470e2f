"""Speculative decoding on an input-grounded task: acceptance rate and decode tok/s with and
without speculation, batch 1 and batch 8, greedy, SmolLM2-135M-Instruct (the embedded GGUF) or any
checkpoint; the n-gram proposer, or a Qwen3.5 checkpoint's multi-token-prediction head.

    python benchmarks/bench_speculative.py                      # K = 4, both tasks, batch 1 and 8
    python benchmarks/bench_speculative.py --k 2 4 8 --dtype bfloat16
    python benchmarks/bench_speculative.py --size 0.8b --proposers ngram mtp --k 2 --quant int4
        # Qwen3.5-0.8B's geometry, random weights, with a random MTP head (made once, in the cache)
    python benchmarks/bench_speculative.py --size 0.8b --proposers mtp --k 1 2 3 --draft-vocab 32768
        # each mtp K also with the head scoring its drafts over the 32,768 lowest ids (--draft-vocab)

Tasks (8 paragraphs each): "repeat": copy a paragraph exactly; "correct": fix the typos in a
paragraph (most of the answer is still copied from the prompt). Decode tok/s counts the tokens
emitted in steps where no sequence is prefilling, over those steps' wall time (best of REPEATS
runs, so a noisy neighbour on a 2-core machine spoils fewer figures); acceptance = kept
proposals / proposals verified. Greedy outputs are checked to be identical with and without speculation. Results go to
benchmarks/results/DATE-speculative/speculative.json with the machine (CPU model and flags, versions, commit).
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from result_folder import result_folder

from qwen_serve.cache_dir import cache_dir

REPEATS = 2
MAX_TOKENS = 160
PARAGRAPHS = [
    "The library opens at nine in the morning and closes at six in the evening. On Saturdays it closes at noon, "
    "and on Sundays it stays closed all day.",
    "To reset the router, hold the small button on the back for ten seconds until the light blinks orange, then "
    "wait two minutes for it to restart.",
    "Our team meets every Tuesday at three o'clock in the large conference room on the second floor to review "
    "the progress of each project.",
    "Water the tomato plants early in the morning, keep the soil moist but not wet, and pick the fruit as soon "
    "as it turns deep red.",
    "The train to the airport leaves from platform four every twenty minutes, and the journey takes about half "
    "an hour in normal traffic.",
    "Please bring a copy of your passport, two recent photographs and the signed application form to the office "
    "before the end of the month.",
    "The museum's new exhibition shows paintings from the early twentieth century, including several works that "
    "have never been displayed before.",
    "Preheat the oven to two hundred degrees, mix the flour with the butter and sugar, and bake the biscuits for "
    "twelve minutes until golden.",
]
TYPOS = {"the ": "teh ", "and ": "adn ", "morning": "mornign", "minutes": "minuets", "before": "befor",
         "until": "untill", "every": "evrey", "which": "wich"}


def with_typos(text: str) -> str:
    for right, wrong in TYPOS.items():
        text = text.replace(right, wrong, 2)
    return text


def task_prompts(tokenizer, task: str) -> list[list[int]]:
    if task == "repeat":
        asks = [f"Repeat this text exactly, with no other words:\n\n{p}" for p in PARAGRAPHS]
    else:
        asks = [f"Correct the spelling mistakes in this text and write it out again:\n\n{with_typos(p)}"
                for p in PARAGRAPHS]
    return [tokenizer.encode_chat([{"role": "user", "content": a}]) for a in asks]


def hybrid_checkpoint(size: str) -> Path:
    """Qwen3.5's geometry of that size with random bf16 weights and a random MTP head."""
    from bench_hybrid import SIZES

    from qwen_serve.conformance.models import add_mtp_head, make_qwen3_5_checkpoint

    path = cache_dir("peers") / f"qwen3.5-{size}-random-bf16-mtp"
    if not (path / "mtp.safetensors").exists():
        geometry, linear = SIZES[size]
        make_qwen3_5_checkpoint(path, geometry, linear, seed=3, dtype="bfloat16", init_std=0.05)
        add_mtp_head(path, seed=3, init_std=0.05)
    return path


def run(llm, prompts: list[list[int]], batch: int, max_tokens: int) -> dict:
    """Decode tok/s (best of REPEATS), acceptance, and the outputs, running `batch` at a time."""
    from qwen_serve import SamplingParams

    engine = llm.engine
    params = SamplingParams(max_tokens=max_tokens)
    best, outputs = None, None
    for repeat in range(REPEATS):
        stats0 = (engine.stats.draft_tokens_total, engine.stats.accepted_draft_tokens_total)
        decode_s, decoded = 0.0, 0
        results = []
        for first in range(0, len(prompts), batch):
            seqs = [engine.add_request(f"bench-{repeat}-{first + i}-{time.monotonic_ns()}", p, params)
                    for i, p in enumerate(prompts[first:first + batch])]
            while engine.has_unfinished():
                prefilling = any(s.num_uncomputed > 1 for s in engine.scheduler.running) or engine.scheduler.waiting
                start = time.perf_counter()
                step_outputs = engine.step()
                elapsed = time.perf_counter() - start
                if not prefilling:
                    decode_s += elapsed
                    decoded += sum(len(o.new_token_ids) for o in step_outputs)
            results.extend(s.output_token_ids for s in seqs)
        drafts = engine.stats.draft_tokens_total - stats0[0]
        accepted = engine.stats.accepted_draft_tokens_total - stats0[1]
        figures = dict(decode_tok_s=decoded / decode_s, drafts=drafts, accepted=accepted,
                       acceptance=accepted / drafts if drafts else None,
                       output_tokens=sum(len(r) for r in results))
        if best is None or figures["decode_tok_s"] > best["decode_tok_s"]:
            best = figures
        outputs = results
    return dict(best, outputs=outputs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--k", type=int, nargs="+", default=[4], help="num_speculative_tokens values to measure")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--tasks", nargs="+", default=["repeat", "correct"])
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--proposers", nargs="+", default=["ngram"], choices=["ngram", "mtp"])
    parser.add_argument("--quant", default="none")
    parser.add_argument("--max-tokens", type=int, default=MAX_TOKENS)
    parser.add_argument("--size", choices=["0.8b", "2b"], help="Qwen3.5's geometry with random weights and an MTP "
                                                              "head instead of SmolLM2")
    parser.add_argument("--draft-vocab", nargs="+", default=[], metavar="N|FILE",
                        help="mtp: each K again with drafts scored over these tokens (--draft-vocab)")
    parser.add_argument("--out", type=Path, help="default: results/DATE-speculative/speculative.json")
    args = parser.parse_args()

    from qwen_serve import LLM
    from qwen_serve.bench.machine import describe_machine, machine_header

    machine = describe_machine(measure_bandwidth=False)
    print(machine_header(machine))
    model = str(hybrid_checkpoint(args.size)) if args.size else None
    print(f"model: {model or 'SmolLM2-135M-Instruct (embedded GGUF)'}, dtype {args.dtype}, quant {args.quant}, "
          f"greedy, max_tokens {args.max_tokens}")
    configs = {"off": {}} | {f"{p} k={k}": dict(speculative=p, num_speculative_tokens=k)
                             for p in args.proposers for k in args.k}
    if "mtp" in args.proposers:
        configs |= {f"mtp k={k} vocab {v}": dict(speculative="mtp", num_speculative_tokens=k, draft_vocab=v)
                    for k in args.k for v in args.draft_vocab}
    engines = {name: LLM(model, dtype=args.dtype, quant=args.quant, max_batch=8, **options)
               for name, options in configs.items()}
    rows = []
    print("| task | batch | speculation | decode tok/s | speed-up | acceptance | identical |")
    print("|---|---|---|---|---|---|---|")
    for task in args.tasks:
        prompts = task_prompts(engines["off"].tokenizer, task)
        for batch in args.batches:
            base = None
            for name, llm in engines.items():
                r = run(llm, prompts, batch, args.max_tokens)
                base = base or r
                same = r["outputs"] == base["outputs"]
                speedup = r["decode_tok_s"] / base["decode_tok_s"]
                rate = "-" if r["acceptance"] is None else f"{r['acceptance']:.0%} ({r['accepted']}/{r['drafts']})"
                print(f"| {task} | {batch} | {name} | {r['decode_tok_s']:.1f} | {speedup:.2f}x | {rate} | {same} |",
                      flush=True)
                rows.append(dict(task=task, batch=batch, speculation=name, identical=same, speedup=speedup,
                                 **{k: v for k, v in r.items() if k != "outputs"}))
    out = args.out or result_folder("speculative") / "speculative.json"
    out.write_text(json.dumps(dict(machine=machine, model=model, dtype=args.dtype, quant=args.quant,
                                   max_tokens=args.max_tokens, rows=rows), indent=1))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
