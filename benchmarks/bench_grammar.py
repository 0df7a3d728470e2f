"""Structured output on this machine: the grammar libraries side by side, then the engine's cost.

    python benchmarks/bench_grammar.py                   # both parts, about a minute
    python benchmarks/bench_grammar.py --only libraries  # or: engine

libraries  xgrammar and llguidance on SmolLM2's tokenizer (vocab 49,152) and the Qwen tokenizer
           (vocab 151,936): the one-off tokenizer set-up, the compile time of a few JSON schemas
           (matcher construction and first mask included: what a request waits for before its
           first token), and the per-step mask time while walking a valid document token by
           token (fill the next-token bitmask, then accept the token). xgrammar's compile cache
           is off, so every schema is compiled from scratch as a new request's would be.
           Needs both libraries installed (`pip install xgrammar llguidance`).
engine     What qwen-serve's grammar processor costs inside the engine, on SmolLM2 and on a
           2-layer Qwen3 with the real vocabulary (where the sampler is most of a step): the
           mask's time per decode step (llguidance's mask plus accepting the token, measured
           around the processor's state), and batch-8 decode throughput with one json_schema
           request among seven free ones against eight free ones.

Timings are medians over repeats; the CPU model and flags head the output.
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

from qwen_serve.bench.machine import machine_header
from qwen_serve.bench.stats import percentiles

SCHEMAS = {
    "person": {
        "type": "object",
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
                       "email": {"type": "string", "pattern": "^[a-z]+@[a-z]+\\.[a-z]{2,3}$"}},
        "required": ["name", "age", "email"],
    },
    "order (nested, arrays, enums)": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "customer": {"type": "object", "properties": {
                "name": {"type": "string"},
                "address": {"type": "object", "properties": {
                    "street": {"type": "string"}, "city": {"type": "string"},
                    "zip": {"type": "string", "pattern": "^[0-9]{5}$"}}, "required": ["street", "city", "zip"]}},
                "required": ["name", "address"]},
            "items": {"type": "array", "minItems": 1, "items": {"type": "object", "properties": {
                "sku": {"type": "string", "enum": ["A-1", "B-2", "C-3"]},
                "qty": {"type": "integer", "minimum": 1}, "price": {"type": "number"}},
                "required": ["sku", "qty", "price"]}},
            "status": {"type": "string", "enum": ["new", "paid", "shipped"]},
        },
        "required": ["id", "customer", "items", "status"],
    },
    "any object": {"type": "object"},
    "24 typed fields": {
        "type": "object",
        "properties": {f"field_{i}": [{"type": "string"}, {"type": "integer"}, {"type": "boolean"},
                                      {"type": "array", "items": {"type": "number"}}][i % 4] for i in range(24)},
        "required": [f"field_{i}" for i in range(0, 24, 2)],
    },
}
DOCUMENTS = {
    "person": {"name": "Ada Lovelace", "age": 36, "email": "ada@math.org"},
    "order (nested, arrays, enums)": {
        "id": 1042, "customer": {"name": "Bob", "address": {"street": "1 Main St", "city": "Springfield", "zip": "12345"}},
        "items": [{"sku": "A-1", "qty": 2, "price": 9.5}, {"sku": "C-3", "qty": 1, "price": 120.0}], "status": "paid"},
    "any object": {"title": "notes", "tags": ["a", "b"], "meta": {"pages": 3, "draft": False}},
    "24 typed fields": {f"field_{i}": ["text", 7, True, [1.5, 2.0]][i % 4] for i in range(24)},
}
REPEATS = 5


def tokenizers_under_test():
    from qwen_serve.checkpoints.checkpoint import load_checkpoint
    from qwen_serve.checkpoints.default_model import default_model_path
    from qwen_serve.conformance.qwen_tokenizer import build_qwen_tokenizer

    smollm2 = load_checkpoint(default_model_path())
    return {
        "SmolLM2 (49,152)": (smollm2.tokenizer.backend, smollm2.config.vocab_size, list(smollm2.config.eos_token_ids)),
        "Qwen (151,936)": (build_qwen_tokenizer(), 151936, [151645]),
    }


def median_ms(seconds: list[float]) -> float:
    return statistics.median(seconds) * 1e3


class LLGuidance:
    name = "llguidance"

    def __init__(self, backend, vocab: int, eos: list[int]) -> None:
        import llguidance
        import llguidance.numpy

        self.llg, self.np_api = llguidance, llguidance.numpy
        self.tokenizer = llguidance.LLTokenizer(backend.to_str(), n_vocab=vocab, eos_token=eos)
        self.mask = llguidance.numpy.allocate_token_bitmask(1, vocab)

    def matcher(self, schema: dict):
        grammar = self.llg.LLMatcher.grammar_from_json_schema(json.dumps(schema))
        matcher = self.llg.LLMatcher(self.tokenizer, grammar)
        assert not matcher.is_error(), matcher.get_error()
        return matcher

    def fill(self, matcher) -> None:
        self.np_api.fill_next_token_bitmask(matcher, self.mask)

    def allowed(self, token: int) -> bool:
        return bool((int(self.mask[0, token // 32]) >> (token % 32)) & 1)

    def accept(self, matcher, token: int) -> bool:
        return matcher.consume_token(token)


class XGrammar:
    name = "xgrammar"

    def __init__(self, backend, vocab: int, eos: list[int]) -> None:
        import xgrammar
        from transformers import PreTrainedTokenizerFast

        self.xgr = xgrammar
        info = xgrammar.TokenizerInfo.from_huggingface(PreTrainedTokenizerFast(tokenizer_object=backend),
                                                       vocab_size=vocab, stop_token_ids=eos)
        self.compiler = xgrammar.GrammarCompiler(info, max_threads=2, cache_enabled=False)
        self.mask = xgrammar.allocate_token_bitmask(1, vocab)

    def matcher(self, schema: dict):
        return self.xgr.GrammarMatcher(self.compiler.compile_json_schema(json.dumps(schema)))

    def fill(self, matcher) -> None:
        matcher.fill_next_token_bitmask(self.mask)

    def allowed(self, token: int) -> bool:
        return bool((int(self.mask[0, token // 32]) >> (token % 32)) & 1)

    def accept(self, matcher, token: int) -> bool:
        return matcher.accept_token(token)


def libraries() -> None:
    print(f"\n## grammar libraries\n{machine_header()}")
    toks = tokenizers_under_test()
    print(f"\n{'library':11s} {'tokenizer':17s} {'set-up s':>9s}  " + "  ".join(f"{n[:14]:>14s}" for n in SCHEMAS)
          + f"  {'mask/step ms':>13s} {'p90':>6s} {'max':>6s}")
    for lib in (LLGuidance, XGrammar):
        for label, (backend, vocab, eos) in toks.items():
            start = time.perf_counter()
            engine = lib(backend, vocab, eos)
            setup = time.perf_counter() - start
            compile_ms, steps = [], []
            for name, schema in SCHEMAS.items():
                times = []
                for _ in range(REPEATS):
                    start = time.perf_counter()
                    matcher = engine.matcher(schema)
                    engine.fill(matcher)
                    times.append(time.perf_counter() - start)
                compile_ms.append(median_ms(times))
                ids = backend.encode(json.dumps(DOCUMENTS[name]), add_special_tokens=False).ids
                for _ in range(REPEATS):
                    matcher = engine.matcher(schema)
                    for token in ids:
                        start = time.perf_counter()
                        engine.fill(matcher)
                        steps.append(time.perf_counter() - start)
                        assert engine.allowed(token) and engine.accept(matcher, token), (lib.name, name, token)
            p90 = percentiles(steps, (90,))["p90"]
            print(f"{lib.name:11s} {label:17s} {setup:9.2f}  " + "  ".join(f"{ms:11.2f} ms" for ms in compile_ms)
                  + f"  {median_ms(steps):13.3f} {p90 * 1e3:6.3f} {max(steps) * 1e3:6.3f}", flush=True)
    print("(set-up: tokenizer info, once per model; each schema: compile + matcher + first mask, median of "
          f"{REPEATS}; mask/step: median over every token of the four documents, {REPEATS} walks each)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", choices=("libraries", "engine"))
    args = parser.parse_args()
    if args.only in (None, "libraries"):
        libraries()
    if args.only in (None, "engine"):
        engine()


def engine() -> None:
    import tempfile
    from pathlib import Path

    from bench_sampling import BATCH, bench_prompts, decode_tokens_per_s, tiny_qwen3_full_vocab

    from qwen_serve import LLM, SamplingParams
    from qwen_serve.conformance.models import smollm2_gguf
    from qwen_serve.logits.structured import GrammarState
    from qwen_serve.sampling.params import StructuredOutput

    print(f"\n## structured output in the engine\n{machine_header()}")
    # long enough that the constrained row decodes through the whole measurement
    long_array = StructuredOutput.json_schema({"type": "array", "items": {"type": "integer"}, "minItems": 80})
    settings = {"sampled (T 0.8, top-p 0.95)": dict(temperature=0.8, top_p=0.95, seed=1, max_tokens=48),
                "greedy": dict(max_tokens=48)}
    timings: list[float] = []
    adjust, accept = GrammarState.adjust, GrammarState.accept

    def timed(method):
        def wrapper(self, *args):
            start = time.perf_counter()
            try:
                return method(self, *args)
            finally:
                timings.append(time.perf_counter() - start)
        return wrapper

    with tempfile.TemporaryDirectory() as tmp:
        models = {"SmolLM2-135M": str(smollm2_gguf()), "Qwen3 2-layer, vocab 151,936": tiny_qwen3_full_vocab(Path(tmp))}
        for label, path in models.items():
            llm = LLM(path, prefix_cache=False)
            prompts = bench_prompts(llm, BATCH)
            for name, setting in settings.items():
                free = SamplingParams(**setting, ignore_eos=True)
                constrained = SamplingParams(**setting, structured=long_array)
                decode_tokens_per_s(llm, [free] * BATCH, prompts)  # warm-up
                base = decode_tokens_per_s(llm, [free] * BATCH, prompts)
                GrammarState.adjust, GrammarState.accept = timed(adjust), timed(accept)
                try:
                    timings.clear()
                    mixed = decode_tokens_per_s(llm, [constrained] + [free] * (BATCH - 1), prompts)
                finally:
                    GrammarState.adjust, GrammarState.accept = adjust, accept
                per_step = 2 * statistics.median(timings) * 1e3  # one mask + one accept per step
                print(f"{label:30s} {name:28s} batch {BATCH}: {base:7.1f} tok/s free, {mixed:7.1f} tok/s with one "
                      f"json_schema request (ratio {mixed / base:.3f}); mask + accept {per_step:.3f} ms per step",
                      flush=True)
    print("(the ratio includes applying the mask to the logits in the sampler; tokens/s: best of "
          "the bench_sampling repeats, decode steps only)")


if __name__ == "__main__":
    main()
