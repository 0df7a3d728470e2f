"""What the sampling fields cost: batch-8 decode throughput with plain requests and with each
field of SamplingParams turned on, in one process, side by side.

    python benchmarks/bench_sampling.py                 # SmolLM2 and a 2-layer Qwen3 with the real vocabulary
    python benchmarks/bench_sampling.py --only plain    # plain greedy and sampled rows only (runs on older code too)
    python benchmarks/bench_sampling.py --only overhead # what the engine adds around the sampler for plain rows

SmolLM2-135M (vocab 49,152) shows the cost inside a real model's step; the tiny Qwen3 (2 layers,
hidden 64, vocab 151,936) shows the worst case, where the sampler and the logits processors are
most of the step. "overhead" times, on the same logits of the full-vocabulary model, the
engine's StepSampler (which asks every row for a logits adjustment first) against the backend's
sampler called directly, alternating 200 times: the cost plain requests pay for the processors
that do not apply to them, free of the run-to-run noise of whole decode runs. Decode tokens/s count only steps in which every sequence decodes one token
(prefill steps are left out); each figure is the best of REPEATS runs, since on a 2-core machine
another busy process slows a run by a lot and the best keeps the quiet ones.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from qwen_serve.bench.machine import machine_header

BATCH = 8
DECODE_TOKENS = 48
REPEATS = 3


def decode_tokens_per_s(llm, params_per_row, prompts) -> float:
    """Best-of-REPEATS batch decode rate of len(prompts) requests run together."""
    engine = llm.engine
    best = 0.0
    for repeat in range(REPEATS):
        for i, (prompt, params) in enumerate(zip(prompts, params_per_row)):
            engine.add_request(f"bench-{time.monotonic_ns()}-{repeat}-{i}", prompt, params)
        decode_s, decoded = 0.0, 0
        while engine.has_unfinished():
            prefilling = any(s.num_uncomputed > 1 for s in engine.scheduler.running) or engine.scheduler.waiting
            start = time.perf_counter()
            outputs = engine.step()
            if not prefilling:
                decode_s += time.perf_counter() - start
                decoded += len(outputs)
        best = max(best, decoded / decode_s)
    return best


def bench_prompts(llm, count: int) -> list[list[int]]:
    words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()
    return [llm.tokenizer.encode(" ".join(words[i % 5:i % 5 + 8 + i]))[:24] for i in range(count)]


def tiny_qwen3_full_vocab(directory: Path) -> str:
    from qwen_serve.conformance.models import Qwen3Geometry, make_qwen3_checkpoint

    return str(make_qwen3_checkpoint(directory, Qwen3Geometry(), seed=0))  # 2 layers, hidden 64, full vocab


def configurations(only_plain: bool) -> dict:
    from qwen_serve import SamplingParams

    common = dict(max_tokens=DECODE_TOKENS, ignore_eos=True)
    sampled = dict(common, temperature=0.8, top_p=0.95, seed=1)
    configs = {
        "plain greedy": SamplingParams(**common),
        "plain sampled (T 0.8, top-p 0.95)": SamplingParams(**sampled),
    }
    if not only_plain:
        configs.update({
            "presence + frequency + repetition": SamplingParams(**sampled, presence_penalty=0.5,
                                                                 frequency_penalty=0.5, repetition_penalty=1.2),
            "logit_bias (16 tokens)": SamplingParams(**sampled, logit_bias={t: 5.0 for t in range(100, 116)}),
            "min_p 0.05": SamplingParams(**sampled, min_p=0.05),
            "min_tokens (all 48)": SamplingParams(**sampled, min_tokens=DECODE_TOKENS),
        })
    return configs


def dispatch_overhead(llm) -> None:
    import statistics

    import torch

    from qwen_serve import SamplingParams

    engine = llm.engine
    prompts = bench_prompts(llm, BATCH)
    for name, params in (("greedy", SamplingParams(max_tokens=4)), ("sampled", SamplingParams(temperature=0.8, top_p=0.95,
                                                                                                max_tokens=4))):
        seqs = [engine.add_request(f"overhead-{name}-{i}", p, params) for i, p in enumerate(prompts)]
        logits = torch.randn(BATCH, llm.config.vocab_size) * 3
        direct, through = [], []
        for _ in range(200 if name == "greedy" else 20):
            start = time.perf_counter()
            engine.sampler.sample(logits, [s.params for s in seqs], [s.generator for s in seqs])
            direct.append(time.perf_counter() - start)
            start = time.perf_counter()
            engine.step_sampler.sample(logits, seqs)
            through.append(time.perf_counter() - start)
        for seq in seqs:
            engine.abort(seq.request_id)
        d, t = statistics.median(direct) * 1e3, statistics.median(through) * 1e3
        print(f"{'overhead, vocab ' + str(llm.config.vocab_size):30s} {name:8s} batch {BATCH}: sampler {d:.3f} ms, "
              f"through the engine's StepSampler {t:.3f} ms (+{(t - d) * 1e3:.0f} us per step)", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("plain", "overhead"))
    args = parser.parse_args()
    from qwen_serve import LLM
    from qwen_serve.conformance.models import smollm2_gguf

    print(f"## batch-{BATCH} decode tokens/s\n{machine_header()}")
    with tempfile.TemporaryDirectory() as tmp:
        models = {"SmolLM2-135M": str(smollm2_gguf()), "Qwen3 2-layer, vocab 151,936": tiny_qwen3_full_vocab(Path(tmp))}
        if args.only == "overhead":
            dispatch_overhead(LLM(models["Qwen3 2-layer, vocab 151,936"], prefix_cache=False))
            return
        for label, path in models.items():
            llm = LLM(path, prefix_cache=False)
            prompts = bench_prompts(llm, BATCH)
            decode_tokens_per_s(llm, [next(iter(configurations(True).values()))] * BATCH, prompts)  # warm-up
            for name, params in configurations(args.only == "plain").items():
                rate = decode_tokens_per_s(llm, [params] * BATCH, prompts)
                print(f"{label:30s} {name:36s} {rate:8.1f} tok/s", flush=True)


if __name__ == "__main__":
    main()
