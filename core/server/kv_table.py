"""`qwen-serve kv-table`: the KV-cache memory arithmetic as a command.

    qwen-serve kv-table                                   # the Qwen3 family, 4k and 32k contexts
    qwen-serve kv-table Qwen3-8B path/to/config.json --context 4096 32768 --budget 16GiB
    qwen-serve kv-table Qwen3-0.6B --window 1024 --json   # as held by the sliding-window cache

For each model: KV bytes per token and per block in fp32 / bf16 / int8 with its scales / "as if
MHA" (bf16 with as many kv heads as query heads), the share of layers that keep a full cache
(windowed layouts keep only a window in the others; linear-attention layers a fixed-size state per
sequence instead), each sequence's KV (and state) at the given context lengths, the weights in total and as read per decoded token (a mixture of experts reads
only the experts its router picks), and with --budget how many such sequences fit next to the weights. A markdown
table by default, --json for scripts. Every figure comes from qwen_serve.kv.memory.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Any, Sequence

from ..kv.geometry import QWEN3_FAMILY, WEIGHT_BYTES, KVGeometry
from ..kv.memory import BFLOAT16, FLOAT32, INT8, INT8_WITHOUT_SCALES, format_bytes, sequences_that_fit

FORMATS = {"float32": FLOAT32, "bfloat16": BFLOAT16, "int8": INT8, "int8_without_scales": INT8_WITHOUT_SCALES}
HEADERS = {"float32": "fp32", "bfloat16": "bf16", "int8": "int8 + scales", "int8_without_scales": "int8, no scales",
           "mha_bfloat16": "as if MHA (bf16)"}
UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12,
         "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12,
         "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}


def parse_bytes(text: str) -> int:
    """'16GiB', '500 MB', '1e9' -> bytes (GiB = 2**30, GB = 10**9)."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:e[0-9]+)?)\s*([a-z]*)\s*", text.lower())
    if not match or match.group(2) not in UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 16GiB, 500MB)")
    return int(float(match.group(1)) * UNITS[match.group(2)])


def parse_context(text: str) -> int:
    """'4096' or '4k' (= 4096) -> tokens."""
    match = re.fullmatch(r"\s*([0-9]+)\s*(k?)\s*", text.lower())
    if not match or int(match.group(1)) <= 0:
        raise argparse.ArgumentTypeError(f"not a positive token count: {text!r} (e.g. 4096 or 4k)")
    return int(match.group(1)) * (1024 if match.group(2) else 1)


def resolve_model(name: str) -> KVGeometry:
    """A built-in Qwen3 name (case-insensitive, "Qwen3-" optional) or a config.json / checkpoint dir."""
    wanted = name.lower().removeprefix("qwen3-")
    for geometry in QWEN3_FAMILY:
        if geometry.name.lower().removeprefix("qwen3-") == wanted:
            return geometry
    if Path(name).exists() or "/" in name or name.endswith(".json"):
        return KVGeometry.from_config_file(name)
    raise ValueError(f"unknown model {name!r}: built in are {', '.join(g.name for g in QWEN3_FAMILY)}, "
                     "or give a config.json path")


def model_figures(g: KVGeometry, contexts: Sequence[int], block_size: int, budget: int | None,
                  weights: str) -> dict[str, Any]:
    per_token = {key: g.bytes_per_token(fmt) for key, fmt in FORMATS.items()}
    per_token["mha_bfloat16"] = g.bytes_per_token(BFLOAT16, kv_heads=g.num_heads)
    weight_bytes = g.weight_bytes(weights)
    rows = []
    for n in contexts:
        at = {key: g.bytes_at(n, fmt) for key, fmt in FORMATS.items()}
        at["mha_bfloat16"] = g.bytes_at(n, BFLOAT16, kv_heads=g.num_heads)
        row: dict[str, Any] = {"context": n, "bytes": at}
        if budget is not None:
            row["sequences_in_budget"] = {key: sequences_that_fit(budget, weight_bytes, at[key])
                                          for key in ("float32", "bfloat16", "int8")}
        rows.append(row)
    return {
        "name": g.name, "layers": g.num_layers, "heads": g.num_heads, "kv_heads": g.num_kv_heads,
        "head_dim": g.head_dim, "full_cache_layers": g.full_layers, "window": g.window,
        "linear_attention_layers": g.linear_layers, "state_bytes_per_sequence": g.state_bytes,
        "bytes_per_token": per_token,
        "bytes_per_block": {key: value * block_size for key, value in per_token.items()},
        "bf16_over_int8": per_token["bfloat16"] / per_token["int8"],
        "parameters": g.parameters(), "weight_bytes": weight_bytes, "contexts": rows,
        # what one decoded token reads: all but the experts its router skips (= the totals when dense)
        "active_parameters": g.parameters(active=True), "active_weight_bytes": g.weight_bytes(weights, active=True),
    }


def table(headers: list[str], rows: list[list[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "|".join("---" for _ in headers) + "|"]
    return "\n".join(lines + ["| " + " | ".join(r) + " |" for r in rows])


def render_markdown(report: dict[str, Any]) -> str:
    models, block = report["models"], report["block_size"]
    full = lambda m: (f"{m['full_cache_layers']}/{m['layers']} ({m['full_cache_layers'] / m['layers']:.0%})"
                      + (f"; {m['layers'] - m['full_cache_layers'] - m['linear_attention_layers']} keep the last "
                         f"{m['window']}" if m["window"] else "")
                      + (f"; {m['linear_attention_layers']} linear attention: "
                         f"{format_bytes(m['state_bytes_per_sequence'])} of state per sequence"
                         if m["linear_attention_layers"] else ""))
    per_token = table(
        ["model", "layers", "kv heads x head_dim", "layers with a full cache"] + [f"{HEADERS[k]} / token" for k in
        ("float32", "bfloat16", "int8", "mha_bfloat16")] + [f"bf16 / block of {block}", f"int8 / block of {block}",
                                                            "bf16 / int8"],
        [[m["name"], str(m["layers"]), f"{m['kv_heads']} x {m['head_dim']}", full(m)]
         + [format_bytes(m["bytes_per_token"][k]) for k in ("float32", "bfloat16", "int8", "mha_bfloat16")]
         + [format_bytes(m["bytes_per_block"]["bfloat16"]), format_bytes(m["bytes_per_block"]["int8"]),
            f"{m['bf16_over_int8']:.2f}x"] for m in models])
    keys = ("float32", "bfloat16", "int8", "int8_without_scales", "mha_bfloat16")
    per_sequence = table(
        ["model", "context (tokens)"] + [HEADERS[k] for k in keys],
        [[m["name"], f"{row['context']:,}"] + [format_bytes(row["bytes"][k]) for k in keys]
         for m in models for row in m["contexts"]])
    weights = table(
        ["model", "parameters", "read per token", f"{report['weights']} weights", "read per token"],
        [[m["name"], f"{m['parameters'] / 1e9:.2f}B", f"{m['active_parameters'] / 1e9:.2f}B",
          format_bytes(m["weight_bytes"]), format_bytes(m["active_weight_bytes"])] for m in models])
    parts = ["## KV cache per token", per_token, "## KV cache per sequence", per_sequence,
             "## Weights (a mixture of experts reads only its routed experts per token)", weights]
    if report["budget_bytes"] is not None:
        fits = ("float32", "bfloat16", "int8")
        parts += [f"## Sequences that fit in {format_bytes(report['budget_bytes'])} next to the "
                  f"{report['weights']} weights",
                  table(["model", "weights", "context (tokens)"] + [f"{HEADERS[k]} KV" for k in fits],
                        [[m["name"], format_bytes(m["weight_bytes"]), f"{row['context']:,}"]
                         + [str(row["sequences_in_budget"][k]) for k in fits]
                         for m in models for row in m["contexts"]])]
    return "\n\n".join(parts)


class OneLineErrors(argparse.ArgumentParser):
    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    p = OneLineErrors(prog="qwen-serve kv-table", description="KV-cache memory arithmetic.")
    p.add_argument("models", nargs="*", help="built-in Qwen3 sizes (default: all) or config.json paths")
    p.add_argument("--context", nargs="+", type=parse_context, default=[4096, 32768],
                   help="context lengths in tokens (default: 4096 32768)")
    p.add_argument("--budget", type=parse_bytes, default=None, help="memory for weights + KV, e.g. 16GiB")
    p.add_argument("--weights", default="bfloat16", choices=[*WEIGHT_BYTES, "int4"],
                   help="weight format the budget must also hold (default: bfloat16)")
    p.add_argument("--block-size", type=int, default=16, help="tokens per KV block (default: 16)")
    p.add_argument("--window", type=int, default=None, help="as held by the sliding-window cache: W positions per layer")
    p.add_argument("--json", action="store_true", help="machine-readable output, exact byte counts")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.block_size <= 0 or (args.window is not None and args.window <= 0):
            raise ValueError("--block-size and --window must be positive")
        geometries = [resolve_model(name) for name in args.models] if args.models else list(QWEN3_FAMILY)
        if args.window is not None:
            geometries = [g.with_window(args.window) for g in geometries]
        report = {
            "block_size": args.block_size, "budget_bytes": args.budget, "weights": args.weights,
            "models": [model_figures(g, args.context, args.block_size, args.budget, args.weights) for g in geometries],
        }
    except ValueError as exc:
        print(f"qwen-serve kv-table: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(report, indent=1) if args.json else render_markdown(report))
    return 0
