"""`qwen-serve draft-vocab`: which tokens a narrowed draft head (``--draft-vocab``) should keep,
counted on one's own text.

    qwen-serve draft-vocab --model DIR prompts.txt replies.txt              # coverage table
    qwen-serve draft-vocab --model DIR logs/*.txt --size 32768 -o ids.json  # and the ids to keep

The texts are tokenized with the checkpoint's tokenizer. For each size N the table gives the share
of their tokens that the N lowest ids cover (``--draft-vocab N``) and the share that the N
commonest tokens cover (``--draft-vocab ids.json``), ranked on the first half of each text and
counted on the second, so the figure is what a ranking does on text it has not seen. With -o, the
ids of the --size commonest tokens over all of the texts go to a JSON list.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

SIZES = (8192, 16384, 32768, 65536)


def coverage(ranked: np.ndarray, tokens: np.ndarray, size: int) -> float:
    """The share of tokens among the first `size` ids of ranked."""
    return float(np.isin(tokens, ranked[:size]).mean()) if tokens.size else 0.0


def commonest(tokens: np.ndarray, vocab_size: int) -> np.ndarray:
    """Token ids by count in tokens, most frequent first (ties: the lower id first)."""
    counts = np.bincount(tokens, minlength=vocab_size)
    return np.lexsort((np.arange(vocab_size), -counts))


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="qwen-serve draft-vocab", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("texts", nargs="+", type=Path, help="UTF-8 text files")
    parser.add_argument("--model", required=True, help="a checkpoint directory or GGUF file (its tokenizer)")
    parser.add_argument("--size", type=int, nargs="+", default=list(SIZES), help=f"tokens kept (default {SIZES})")
    parser.add_argument("-o", "--output", type=Path, help="write the first --size's commonest ids here (JSON)")
    args = parser.parse_args(argv)
    try:
        from ..checkpoints.checkpoint import load_checkpoint

        checkpoint = load_checkpoint(args.model)
        vocab_size = checkpoint.config.vocab_size
        if any(not 0 < size < vocab_size for size in args.size):
            raise ValueError(f"--size: give numbers of tokens between 1 and {vocab_size - 1:,}")
        encoded = [np.asarray(checkpoint.tokenizer.encode(path.read_text(), add_special_tokens=False), dtype=np.int64)
                   for path in args.texts]
    except (OSError, ValueError) as exc:
        print(f"qwen-serve draft-vocab: error: {exc}", file=sys.stderr)
        return 2
    halves = [(t[: t.size // 2], t[t.size // 2:]) for t in encoded]
    ranked_on_first = commonest(np.concatenate([first for first, _ in halves]), vocab_size)
    second = np.concatenate([rest for _, rest in halves])
    lowest = np.arange(vocab_size)
    total = sum(t.size for t in encoded)
    print(f"{total:,} tokens in {len(encoded)} texts ({checkpoint.config.name}, vocabulary {vocab_size:,})")
    print("| kept | lowest ids | commonest (ranked on first halves, counted on second) |")
    print("|---|---|---|")
    for size in args.size:
        print(f"| {size:,} | {coverage(lowest, second, size):.1%} | {coverage(ranked_on_first, second, size):.1%} |")
    if args.output:
        ids = commonest(np.concatenate(encoded), vocab_size)[: args.size[0]]
        args.output.write_text(json.dumps(sorted(int(i) for i in ids)))
        print(f"wrote the {args.size[0]:,} commonest ids to {args.output} (use: --draft-vocab {args.output})")
    return 0
