"""Command line: `python -m qwen_serve [flags]`. Errors are one line, exit code 2.

``qwen-serve COMMAND ...`` runs another tool instead of the server: COMMANDS maps each name to
the module whose ``main(argv) -> int`` it runs, imported only when chosen, so a tool's
dependencies (plotting, Ray) never load with the server.
"""
from __future__ import annotations

import argparse
import importlib
import os
import sys
from typing import TYPE_CHECKING, Sequence

from ..config import BATCHING_MODES, TASKS, EngineConfig
from ..engine.async_engine import ARRIVAL_WINDOW_S
from ..errors import QwenServeError
from .auth import ENV_VAR as API_KEY_ENV
from .auth import is_loopback, keys_from
from .connections import MAX_CONNECTIONS, MAX_CONNECTIONS_PER_CLIENT, REQUEST_TIMEOUT_S

if TYPE_CHECKING:
    from .serve import ServeSettings

DEFAULTS = EngineConfig()
GENERATION_CONFIG_CHOICES = ("auto", "none")
COMMANDS: dict[str, str] = {  # subcommand name -> module with main(argv)
    "bench": "qwen_serve.bench.cli",
    "draft-vocab": "qwen_serve.server.draft_vocab",
    "kv-table": "qwen_serve.server.kv_table",
    "ray": "qwen_serve.cluster.cli",
}


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen-serve", description="Serve a Qwen3-family model on CPU.")
    p.add_argument("--model", default=None, help="HF checkpoint dir, .gguf file or hub id (default: embedded SmolLM2-135M-Instruct)")
    p.add_argument("--backend", default="torch", help="compute backend plugin (torch, mlx, ...)")
    p.add_argument("--kv-cache", default="paged", help="KV cache plugin (paged, naive, paged-int8, sliding-window, ...)")
    p.add_argument("--kv-window", type=int, default=None,
                   help="with a sliding-window KV cache: positions each query attends over (tokens)")
    p.add_argument("--task", choices=("auto",) + TASKS, default="auto",
                   help="generate text, embed (POST /v1/embeddings: the last token's hidden state, as "
                        "Qwen3-Embedding) or rerank (POST /v1/rerank and /v1/score, as Qwen3-Reranker); auto: embed "
                        "for an embedding checkpoint, else generate")
    p.add_argument("--quant", default="none", help="weight quantization: none | int4")
    p.add_argument("--dtype", default="float32", help="weight dtype: float32 | bfloat16")
    p.add_argument("--kv-dtype", default="auto",
                   help="KV storage dtype: float32 | bfloat16 | auto (the backend's choice for this CPU; default)")
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
    p.add_argument("--state-cache-mib", type=int, default=DEFAULTS.state_cache_mib, metavar="MIB",
                   help="a model with linear attention (Qwen3.5, Qwen3-Next): memory for the prefix cache's "
                        "recurrent states at block boundaries, least recently used evicted first, those every "
                        f"512 tokens last (default {DEFAULTS.state_cache_mib})")
    p.add_argument("--batching", choices=BATCHING_MODES, default=DEFAULTS.batching,
                   help="continuous (default) or static: admit a new batch only when the last one finished")
    p.add_argument("--served-model-name", default=None, help="model name the API reports and accepts")
    p.add_argument("--reasoning-parser", default=None,
                   help="how replies separate reasoning: qwen3 | none (default: qwen3 if the chat template writes <think>)")
    p.add_argument("--tool-call-parser", default=None, help="how replies' tool calls are read: hermes | qwen3 | "
                   "qwen3_xml | qwen3_coder | none (default: qwen3_xml if the chat template writes <function=, else hermes)")
    p.add_argument("--generation-config", choices=GENERATION_CONFIG_CHOICES, default="auto",
                   help="auto: the sampling fields a request leaves out take the checkpoint's generation_config.json "
                        "values (temperature, top_p, top_k, min_p, repetition_penalty); none: the API's defaults")
    p.add_argument("--reasoning-budget", type=int, default=None, metavar="TOKENS",
                   help="a think block longer than this is closed by the engine (Qwen's early-exit sentence, then "
                        "</think>) unless a request sets its own budget; default: no cap")
    p.add_argument("--speculative", default=None, metavar="PROPOSER",
                   help="speculative decoding with this proposer (ngram: prompt lookup; mtp: the checkpoint's "
                        "multi-token-prediction head, Qwen3.5); needs a KV cache that can rewind (paged, naive)")
    p.add_argument("--num-speculative-tokens", type=int, default=DEFAULTS.num_speculative_tokens,
                   help=f"with --speculative: proposals verified per sequence per step, at most "
                        f"(default {DEFAULTS.num_speculative_tokens})")
    p.add_argument("--draft-vocab", default=None, metavar="N|FILE",
                   help="with --speculative mtp: the head guesses among the N lowest token ids (a BPE vocabulary's "
                        "commonest pieces) or the ids in FILE (a JSON list or whitespace-separated), plus the "
                        "tokenizer's added tokens; each draft then reads those rows of the language-model head, "
                        "not all of them (default: every token)")
    p.add_argument("--scheduling-policy", default=DEFAULTS.scheduling_policy,
                   help="fcfs | priority (requests' 'priority' field: lower first; preempts lower priorities "
                        "when KV blocks run out)")
    s = p.add_argument_group("serving under load")
    s.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (repeat for several keys; "
                        f"also ${API_KEY_ENV}, comma-separated)")
    s.add_argument("--metrics-public", action="store_true", help="serve /metrics without an API key")
    s.add_argument("--max-queue", type=int, default=64,
                   help="requests that may wait beyond the running batch; past that HTTP 429 (default 64)")
    s.add_argument("--queue-timeout", type=float, default=None, metavar="SECONDS",
                   help="fail a request not scheduled within SECONDS with HTTP 503 (default: wait)")
    s.add_argument("--arrival-window", type=float, default=ARRIVAL_WINDOW_S, metavar="SECONDS",
                   help="a new request waits for the next of a burst, so the burst prefills as one batch, for 5%% "
                        f"of the prompts' estimated prefill time, at most SECONDS; 0: never (default {ARRIVAL_WINDOW_S:g})")
    s.add_argument("--request-timeout", type=float, default=REQUEST_TIMEOUT_S, metavar="SECONDS",
                   help="a request's head and its body must arrive, and a streaming client take each event, within "
                        f"SECONDS; past it 408 or the connection closes (default {REQUEST_TIMEOUT_S:g})")
    s.add_argument("--max-connections", type=int, default=MAX_CONNECTIONS,
                   help=f"connections open at once; more are refused (default {MAX_CONNECTIONS})")
    s.add_argument("--max-connections-per-client", type=int, default=MAX_CONNECTIONS_PER_CLIENT,
                   help=f"connections open at once from one address other than this machine's "
                        f"(default {MAX_CONNECTIONS_PER_CLIENT})")
    s.add_argument("--shutdown-timeout", type=float, default=30.0, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, let in-flight requests finish for up to SECONDS, then abort (default 30)")
    s.add_argument("--sse-keepalive", type=float, default=5.0, metavar="SECONDS",
                   help="send an SSE ': keep-alive' comment after SECONDS without an event; 0: never (default 5)")
    s.add_argument("--responses-store-mb", type=float, default=64.0, metavar="MIB",
                   help="keep Responses API responses (store: true) for GET /v1/responses/{id} and "
                        "previous_response_id in memory, up to MIB, the least recently used dropped first; "
                        "0: keep none (default 64)")
    s.add_argument("--log-requests", action="store_true", help="one JSON line per finished request on stderr")
    s.add_argument("--log-prompts", action="store_true", help="with --log-requests: include the prompt text")
    p.add_argument("--prompt", default=None, help="answer one chat message and exit instead of serving")
    p.add_argument("--max-tokens", type=int, default=256, help="with --prompt: tokens to generate at most")
    return p


def engine_options(args: argparse.Namespace) -> dict:
    return dict(
        max_batch=args.max_batch, kv_blocks=args.kv_blocks, block_size=args.block_size,
        chunk_size=args.chunk_size, step_budget=args.step_budget, max_seq_len=args.max_seq_len,
        prefix_cache=not args.no_prefix_cache, seed=args.seed, batching=args.batching,
        scheduling_policy=args.scheduling_policy, kv_window=args.kv_window,
        speculative=args.speculative, num_speculative_tokens=args.num_speculative_tokens, kv_dtype=args.kv_dtype,
        draft_vocab=args.draft_vocab,
        state_cache_mib=args.state_cache_mib,
    )


def serve_settings(args: argparse.Namespace, config: EngineConfig) -> "ServeSettings":
    """The serving flags, checked (a ValueError is the one-line CLI error)."""
    from .app import ServerOptions
    from .serve import ServeSettings

    if args.max_queue < 0:
        raise ValueError(f"--max-queue must be >= 0, got {args.max_queue}")
    if args.queue_timeout is not None and not args.queue_timeout > 0:
        raise ValueError(f"--queue-timeout must be > 0 seconds, got {args.queue_timeout:g}")
    for flag, value in (("--shutdown-timeout", args.shutdown_timeout), ("--sse-keepalive", args.sse_keepalive),
                        ("--arrival-window", args.arrival_window)):
        if not value >= 0:
            raise ValueError(f"{flag} must be >= 0 seconds, got {value:g}")
    if not args.responses_store_mb >= 0:
        raise ValueError(f"--responses-store-mb must be >= 0 MiB, got {args.responses_store_mb:g}")
    if args.reasoning_budget is not None and args.reasoning_budget < 0:
        raise ValueError(f"--reasoning-budget must be >= 0 tokens, got {args.reasoning_budget}")
    if not args.request_timeout > 0:
        raise ValueError(f"--request-timeout must be > 0 seconds, got {args.request_timeout:g}")
    for flag, count in (("--max-connections", args.max_connections),
                        ("--max-connections-per-client", args.max_connections_per_client)):
        if count < 1:
            raise ValueError(f"{flag} must be >= 1, got {count}")
    if args.log_prompts and not args.log_requests:
        raise ValueError("--log-prompts needs --log-requests")
    options = ServerOptions(max_batch=config.max_batch, max_queue=args.max_queue,
                            api_keys=keys_from(args.api_key, os.environ.get(API_KEY_ENV)),
                            metrics_public=args.metrics_public, keepalive_s=args.sse_keepalive,
                            request_timeout_s=args.request_timeout, max_connections=args.max_connections,
                            max_connections_per_client=args.max_connections_per_client,
                            responses_store_mb=args.responses_store_mb, reasoning_budget=args.reasoning_budget)
    return ServeSettings(args.host, args.port, args.quant, args.served_model_name, args.model, options,
                         queue_timeout_s=args.queue_timeout, shutdown_timeout_s=args.shutdown_timeout,
                         arrival_window_s=args.arrival_window,
                         log_requests=args.log_requests, log_prompts=args.log_prompts,
                         reasoning_parser=args.reasoning_parser, tool_call_parser=args.tool_call_parser,
                         generation_config=args.generation_config)


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
    from ..sampling.params import SamplingParams
    from .memory_plan import format_memory_plan

    if args.prompt is None:
        return run_server(args)
    if args.task not in ("auto", "generate"):
        raise ValueError(f"--prompt answers a chat message; it needs --task generate, not {args.task}")
    parts = build_engine(args.model, args.backend, args.kv_cache, args.dtype, args.quant, task=args.task,
                         **engine_options(args))
    defaults = parts.model_config.sampling_defaults.served(args.generation_config)
    print(format_memory_plan(parts, args.dtype, args.quant, defaults), file=sys.stderr)
    ids = parts.tokenizer.encode_chat([{"role": "user", "content": args.prompt}])
    seq = parts.engine.add_request("cli", ids, SamplingParams(max_tokens=args.max_tokens, **defaults.as_dict()))
    while not seq.is_finished:
        for out in parts.engine.step():
            print(out.new_text, end="", flush=True)
    print()
    return 0


def run_server(args: argparse.Namespace) -> int:
    """Check every flag and plugin name, open the port, then load the model behind it."""
    from ..chat.format import check_parser_names
    from ..engine.builder import build_engine
    from ..registry import load_registry
    from .memory_plan import format_memory_plan
    from .serve import serve, warm_up

    check_parser_names(args.reasoning_parser, args.tool_call_parser)  # a typo fails before the model loads
    options = engine_options(args)
    settings = serve_settings(args, EngineConfig(**options))
    if not settings.options.api_keys and not is_loopback(args.host):
        print(f"qwen-serve: warning: listening on {args.host} without an API key: anyone who can reach this "
              f"port can use the model (set --api-key or ${API_KEY_ENV})", file=sys.stderr, flush=True)
    registry = load_registry()
    registry.kv_cache_factory(args.kv_cache)
    registry.backend(args.backend)
    if args.speculative:
        registry.proposer_factory(args.speculative)

    def load():
        parts = build_engine(args.model, args.backend, args.kv_cache, args.dtype, args.quant, registry=registry,
                             task=args.task, **options)
        print(format_memory_plan(parts, args.dtype, args.quant,
                                             parts.model_config.sampling_defaults.served(args.generation_config)), file=sys.stderr,
              flush=True)
        warm_up(parts)
        return parts

    return serve(load, settings)
