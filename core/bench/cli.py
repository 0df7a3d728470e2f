"""`qwen-serve bench`: drive OpenAI-compatible endpoints with streaming requests, sweeping
concurrency and prompt / output lengths; write JSON and PNG plots.

    qwen-serve bench --endpoint ours=http://127.0.0.1:8000 --endpoint llama=http://127.0.0.1:8080 \\
        --concurrency 1,8,16 --prompt-tokens 64 --output-tokens 128 --tokenizer CKPT_DIR --out results/
    qwen-serve bench --prefill --endpoint ours=http://127.0.0.1:8000 --tokenizer CKPT_DIR --out results/
    qwen-serve bench --merge a.json b.json --out results/ --name side-by-side
    qwen-serve bench --kernels --model CKPT_DIR --quant int4   # the paths the backend chose on this CPU
"""
from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path
from typing import Sequence

from ..errors import QwenServeError
from .client import LENGTH_CONTROLS
from .endpoint import EndpointSpec
from .runner import RunOptions, SweepPoint

DEFAULT_CONCURRENCY = "1,2,4,8,16"


def _ints(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or any(v <= 0 for v in values):
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def _lengths(text: str) -> list[tuple[int, int]]:
    """'128' or '64,128' (fixed lengths) or '16:256' (each request draws uniformly from the range)."""
    out = []
    for part in text.split(","):
        lo, _, hi = part.partition(":")
        lo_i, hi_i = _ints(lo)[0], _ints(hi or lo)[0]
        if hi_i < lo_i:
            raise argparse.ArgumentTypeError(f"range {part!r} ends before it starts")
        out.append((lo_i, hi_i))
    return out


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="qwen-serve bench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--endpoint", action="append", default=[], metavar="NAME=URL",
                   help="an OpenAI-compatible server (repeatable: one line per endpoint in the plots)")
    p.add_argument("--merge", nargs="+", type=Path, metavar="JSON", help="merge result files instead of measuring")
    p.add_argument("--concurrency", type=_ints, default=None, help=f"streams in flight (default {DEFAULT_CONCURRENCY})")
    p.add_argument("--prompt-tokens", type=_ints, default=None, help="prompt lengths in tokens (default 64)")
    p.add_argument("--output-tokens", type=_lengths, default=None,
                   help="output lengths, e.g. 128 or 64,128 or 16:256 for a uniform range (default 128)")
    p.add_argument("--prefill", action="store_true",
                   help="prefill mode: defaults become 512-token prompts, 1 output token, concurrency 1")
    p.add_argument("--repetitions", type=int, default=3, help="repetitions per point; throughput is their median")
    p.add_argument("--rounds", type=int, default=1, help="requests per stream per repetition")
    p.add_argument("--warmup", type=int, default=1, help="warm-up rounds per endpoint before measuring")
    p.add_argument("--interleave", action="store_true",
                   help="with several endpoints, their repetitions of each point take turns (on a shared, noisy "
                        "machine the ratio is then measured seconds apart, not minutes)")
    p.add_argument("--api", choices=("auto", "chat", "completions"), default="auto",
                   help="auto: /v1/completions with token-id prompts where the server takes them, else chat")
    p.add_argument("--tokenizer", default=None, help="the served tokenizer (tokenizer.json, checkpoint dir, .gguf); "
                                                     "needed for chat prompts of an exact length")
    p.add_argument("--length-control", choices=LENGTH_CONTROLS, default="ignore_eos",
                   help="request fields that make outputs as long as asked")
    p.add_argument("--sample-metrics", type=float, default=None, metavar="SECONDS",
                   help="sample the server's running/waiting sequences from /metrics at this interval")
    p.add_argument("--note", action="append", default=[], metavar="NAME=TEXT",
                   help="settings of an endpoint to record (e.g. its command line)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=1800.0, help="seconds one request may take")
    p.add_argument("--out", type=Path, default=Path("bench-results"), help="directory for JSON and PNG files")
    p.add_argument("--name", default="bench", help="file name stem: NAME.json, NAME-throughput.png, ...")
    p.add_argument("--no-plots", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--no-bandwidth", action="store_true", help="skip measuring memory bandwidth")
    k = p.add_argument_group("--kernels: load a model and print the compute paths its backend chose by timing")
    k.add_argument("--kernels", action="store_true", help="print the CPU and the table the paths were chosen from")
    k.add_argument("--model", default=None, help="checkpoint (default: the embedded model)")
    k.add_argument("--backend", default="torch")
    k.add_argument("--quant", default="int4")
    k.add_argument("--dtype", default="float32")
    return p


def sweep_points(args: argparse.Namespace) -> list[SweepPoint]:
    concurrency = args.concurrency or ([1] if args.prefill else _ints(DEFAULT_CONCURRENCY))
    prompts = args.prompt_tokens or [512 if args.prefill else 64]
    outputs = args.output_tokens or [(1, 1) if args.prefill else (128, 128)]
    return list(dict.fromkeys(SweepPoint(p, o, c) for p in prompts for o in outputs for c in concurrency))


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return run(args)
    except (ValueError, ConnectionError, OSError, QwenServeError) as exc:
        print(f"qwen-serve bench: error: {exc}", file=sys.stderr)
        return 2


def run(args: argparse.Namespace) -> int:
    from . import report

    if args.kernels:
        return print_kernels(args)
    if args.merge:
        document = report.merge([report.read_json(p) for p in args.merge], [str(p) for p in args.merge])
    elif not args.endpoint:
        raise ValueError("give at least one --endpoint NAME=URL (or --merge FILES)")
    else:
        document = measure(args)
    path = report.write_json(document, args.out / f"{args.name}.json")
    print(report.format_table(document))
    print(f"wrote {path}")
    if not args.no_plots:
        from .plots import write_plots

        for png in write_plots(document, args.out, f"{args.name}-"):
            print(f"wrote {png}")
    return 0


def print_kernels(args: argparse.Namespace) -> int:
    """The CPU's key flags, then the executor's table (ChoosesKernels), measured now if this
    machine has no cached choice for the model's shapes."""
    from ..engine.builder import build_engine
    from ..protocols import ChoosesKernels
    from .machine import machine_header

    print(machine_header())
    parts = build_engine(args.model, args.backend, dtype=args.dtype, quant=args.quant, calibrate=False)
    table = parts.executor.kernel_table() if isinstance(parts.executor, ChoosesKernels) else []
    print("\n".join(table) if table else f"the {args.backend} backend chose no compute paths for this model")
    return 0


def measure(args: argparse.Namespace) -> dict:
    from tqdm import tqdm

    from .machine import describe_machine
    from .report import new_document
    from .runner import run_endpoints

    specs = [EndpointSpec.parse(e) for e in args.endpoint]
    names = [s.name for s in specs]
    if len(set(names)) < len(names):
        raise ValueError(f"endpoint names must differ: {', '.join(names)}")
    notes = dict(n.partition("=")[::2] for n in args.note)
    unknown = set(notes) - {s.name for s in specs}
    if unknown:
        raise ValueError(f"--note for an endpoint not given: {', '.join(sorted(unknown))}")
    if args.repetitions < 1 or args.rounds < 1 or args.warmup < 0:
        raise ValueError("--repetitions and --rounds must be >= 1, --warmup >= 0")
    points = sweep_points(args)
    options = RunOptions(repetitions=args.repetitions, rounds=args.rounds, warmup=args.warmup, api=args.api,
                         tokenizer=args.tokenizer, length_control=args.length_control,
                         sample_metrics_s=args.sample_metrics, seed=args.seed, timeout_s=args.timeout)
    machine = describe_machine(measure_bandwidth=not args.no_bandwidth)  # before any load starts
    total = len(specs) * sum(options.requests_per_point(p) for p in points)
    with tqdm(total=total, unit="req", disable=True if args.no_progress else None, file=sys.stderr, dynamic_ncols=True) as bar:
        endpoints = asyncio.run(run_endpoints(specs, points, options, lambda: bar.update(1), bar.set_description,
                                              interleave=args.interleave))
    for record in endpoints:
        if record["name"] in notes:
            record["notes"] = notes[record["name"]]
    settings = {"points": [p.as_dict() for p in points], "repetitions": args.repetitions, "rounds": args.rounds,
                "interleaved": args.interleave,
                "warmup": args.warmup, "api": args.api, "length_control": args.length_control,
                "seed": args.seed, "client": "aiohttp streaming, one connection per in-flight request",
                "argv": sys.argv[1:]}
    return new_document(machine, settings, endpoints)
