"""Build a `tokenizers.Tokenizer` from the tokenizer metadata llama.cpp stores in a GGUF file.

A GGUF carries no tokenizer.json: only the vocabulary, the merges, per-token types and the name
(`tokenizer.ggml.pre`) of the split regex llama.cpp uses. Ids must match what the model was
trained on, so every choice below mirrors llama.cpp / the original tokenizer.json.
"""

from __future__ import annotations

import warnings
from typing import Any

import gguf
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

# llama.cpp token types (`llama_token_type`); only these two must be matched whole in text.
CONTROL = 3
USER_DEFINED = 4

_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# Qwen3.5's tokenizer.json: Qwen2's, with combining marks (\p{M}) kept inside words
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)

# `tokenizer.ggml.pre` names grouped by the pre-tokenization they stand for in llama.cpp.
_GPT2_PRES = {"default", "gpt-2", "gpt2", "mpt", "olmo", "jais", "trillion", "granite-docling"}
# GPT-2's regex after isolating every digit (tokenizer.json: Digits(individual) + ByteLevel).
_DIGITS_GPT2_PRES = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone", "minerva-7b"}
_SPLIT_PRES = {
    "qwen2": _QWEN2_SPLIT,
    "deepseek-r1-qwen": _QWEN2_SPLIT,
    "qwen35": _QWEN35_SPLIT,
    "llama-bpe": _LLAMA3_SPLIT,
    "llama3": _LLAMA3_SPLIT,
    "llama-v3": _LLAMA3_SPLIT,
    "smaug-bpe": _LLAMA3_SPLIT,
    "dbrx": _LLAMA3_SPLIT,
    "falcon3": _LLAMA3_SPLIT,
}
# Llama 3 style vocabularies look a whole pre-token up before merging (tiktoken semantics).
_IGNORE_MERGES_PRES = {"llama-bpe", "llama3", "llama-v3", "smaug-bpe", "dbrx", "falcon3"}


def gguf_fields(reader: gguf.GGUFReader) -> dict[str, Any]:
    """Plain python values for every field of a `gguf.GGUFReader`.

    The reader exposes numpy memmap slices; callers want str/int/float/bool/list so that the
    metadata can be compared, hashed and kept after the file is closed.
    """
    array, string = gguf.GGUFValueType.ARRAY, gguf.GGUFValueType.STRING
    out: dict[str, Any] = {}
    for name, field in reader.fields.items():
        if not field.types:
            continue
        if field.types[0] == array:
            if field.types[-1] == string:
                out[name] = [bytes(field.parts[i]).decode("utf-8") for i in field.data]
            else:
                out[name] = [v for i in field.data for v in field.parts[i].tolist()]
        elif field.types[0] == string:
            out[name] = bytes(field.parts[-1]).decode("utf-8")
        else:
            out[name] = field.parts[-1].tolist()[0]
    return out


def _pre_tokenizer(pre: str | None) -> pre_tokenizers.PreTokenizer:
    """The split llama.cpp applies for `tokenizer.ggml.pre`, followed by the byte-level mapping."""
    if pre in _SPLIT_PRES:
        return pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(_SPLIT_PRES[pre]), behavior="isolated"),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ])
    gpt2 = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    if pre in _DIGITS_GPT2_PRES:
        return pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True), gpt2])
    if pre is not None and pre not in _GPT2_PRES:
        warnings.warn(f"unknown tokenizer.ggml.pre {pre!r}; using the GPT-2 split", stacklevel=3)
    return gpt2


def _post_processor(fields: dict, tokens: list[str]) -> processors.PostProcessor | None:
    """BOS/EOS only when the file asks for them; chat templates usually write them themselves."""
    def wanted(flag: str, key: str) -> int | None:
        return fields.get(f"tokenizer.ggml.{key}") if fields.get(f"tokenizer.ggml.{flag}") else None

    bos, eos = wanted("add_bos_token", "bos_token_id"), wanted("add_eos_token", "eos_token_id")
    if bos is None and eos is None:
        return None
    head = [tokens[bos]] if bos is not None else []
    tail = [tokens[eos]] if eos is not None else []
    return processors.TemplateProcessing(
        single=[*head, "$A", *tail],
        pair=[*head, "$A", *tail, *(f"{t}:1" for t in head), "$B:1", *(f"{t}:1" for t in tail)],
        special_tokens=[(tokens[i], i) for i in (bos, eos) if i is not None],
    )


def tokenizer_from_gguf(fields: dict) -> Tokenizer:
    """A byte-level BPE tokenizer equivalent to the one described by GGUF metadata `fields`."""
    kind = fields.get("tokenizer.ggml.model")
    if kind != "gpt2":
        raise ValueError(
            f"unsupported GGUF tokenizer.ggml.model {kind!r}: only byte-level BPE ('gpt2') is supported"
        )
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    types: list[int] = list(fields.get("tokenizer.ggml.token_type") or [1] * len(tokens))
    merges = [tuple(m.split(" ", 1)) for m in fields.get("tokenizer.ggml.merges", [])]
    pre = fields.get("tokenizer.ggml.pre")

    vocab: dict[str, int] = {}
    for index, token in enumerate(tokens):
        vocab.setdefault(token, index)  # keep the first id if a spelling repeats
    tokenizer = Tokenizer(models.BPE(
        vocab=vocab, merges=merges, ignore_merges=pre in _IGNORE_MERGES_PRES, fuse_unk=False,
    ))
    tokenizer.pre_tokenizer = _pre_tokenizer(pre)
    tokenizer.decoder = decoders.ByteLevel()

    # Control tokens are stored raw (e.g. "<|im_start|>") and llama.cpp matches them whole; so
    # must we, or they get split into byte-level pieces. User-defined ones (e.g. "<think>") are
    # matched whole too but are regular text on decode, as in Qwen3's tokenizer.json.
    def added(kind_: int, special: bool) -> list[AddedToken]:
        return [
            AddedToken(t, special=special, normalized=False)
            for i, (t, ty) in enumerate(zip(tokens, types))
            if ty == kind_ and t and vocab.get(t) == i
        ]

    tokenizer.add_special_tokens(added(CONTROL, True))
    tokenizer.add_tokens(added(USER_DEFINED, False))
    post = _post_processor(fields, tokens)
    if post is not None:
        tokenizer.post_processor = post
    return tokenizer
