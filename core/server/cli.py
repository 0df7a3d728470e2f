"""Command line: `python -m qwen_serve [flags]` (SPEC §5). Errors are one line, exit code 2.

``qwen-serve COMMAND ...`` runs another tool instead of the server: COMMANDS maps each name to
the module whose ``main(argv) -> int`` it runs, imported only when chosen, so a tool's
dependencies (plotting, Ray) never load with the server.
"""
from __future__ import annotations

import argparse
import importlib
import sys
from typing import Sequence

from ..config import BATCHING_MODES, EngineConfig
from ..errors import QwenServeError

DEFAULTS = EngineConfig()
COMMANDS: dict[str, str] = {  # subcommand name -> module with main(argv)
    "bench": "qwen_serve.bench.cli",
    "ray": "qwen_serve.cluster.cli",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen-serve", description="Serve a Qwen3-family model on CPU.")
    p.add_argument("--model", default=None, help="HF checkpoint dir, .gguf file or hub id (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--backend", default="torch", help="compute backend plugin (torch, mlx, ...)")
    p.add_argument("--kv-cache", default="paged", help="KV cache plugin (paged, naive, ...)")
    p.add_argument("--quant", default="none", help="weight quantization: none | int4")
    p.add_argument("--dtype", default="float32", help="weight and KV storage dtype: float32 | bfloat16")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--max-batch", type=int, default=DEFAULTS.max_batch)
    p.add_argument("--kv-blocks", type=int, default=DEFAULTS.kv_blocks)
    p.add_argument("--block-size", type=int, default=DEFAULTS.block_size)
    p.add_argument("--chunk-size", type=int, default=DEFAULTS.chunk_size)
    p.add_argument("--step-budget", type=int, default=DEFAULTS.step_budget)
    p.add_argument("--max-seq-len", type=int, default=None)
    p.add_argument("--seed", type=int, default=None, help="seeds the per-request seeds of unseeded requests")
    p.add_argument("--no-prefix-cache", action="store_true")
    p.add_argument("--batching", choices=BATCHING_MODES, default=DEFAULTS.batching,
                   help="continuous (default) or static: admit a new batch only when the last one finished")
    p.add_argument("--served-model-name", default=None, help="model name the API reports and accepts")
    p.add_argument("--reasoning-parser", default=None,
                   help="how replies separate reasoning: qwen3 | none (default: qwen3 if the chat template writes <think>)")
    p.add_argument("--tool-call-parser", default=None, help="how replies' tool calls are read: hermes | qwen3 | none "
                   "(default: hermes)")
    p.add_argument("--prompt", default=None, help="answer one chat message and exit instead of serving")
    p.add_argument("--max-tokens", type=int, default=256, help="with --prompt: tokens to generate at most")
    return p


def engine_options(args: argparse.Namespace) -> dict:
    return dict(
        max_batch=args.max_batch, kv_blocks=args.kv_blocks, block_size=args.block_size,
        chunk_size=args.chunk_size, step_budget=args.step_budget, max_seq_len=args.max_seq_len,
        prefix_cache=not args.no_prefix_cache, seed=args.seed, batching=args.batching,
    )


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return importlib.import_module(COMMANDS[argv[0]]).main(argv[1:])
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (QwenServeError, ValueError) as exc:
        print(f"qwen-serve: error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    from ..engine.builder import build_engine
    from ..engine.sampling_params import SamplingParams
    from ..models.memory_plan import format_memory_plan
    from ..openai.chat_format import ChatFormat, check_parser_names

    check_parser_names(args.reasoning_parser, args.tool_call_parser)  # a typo fails before the model loads
    parts = build_engine(args.model, args.backend, args.kv_cache, args.dtype, args.quant, **engine_options(args))
    print(format_memory_plan(parts, args.dtype, args.quant), file=sys.stderr)
    if args.prompt is None:
        from .serve import serve

        chat_format = ChatFormat(parts.tokenizer, args.reasoning_parser, args.tool_call_parser)
        serve(parts, args.host, args.port, args.quant, args.served_model_name, args.model, chat_format)
        return 0
    ids = parts.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    seq = parts.engine.add_request("cli", ids, SamplingParams(max_tokens=args.max_tokens))
    while not seq.is_finished:
        for out in parts.engine.step():
            print(out.new_text, end="", flush=True)
    print()
    return 0
