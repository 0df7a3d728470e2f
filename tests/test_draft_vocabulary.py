"""``--draft-vocab``: a multi-token-prediction head that scores its guesses over part of the
vocabulary. Its drafts equal transformers' head restricted to those tokens (and differ from the
whole head's, so the narrowing is seen); verification still scores every token, so greedy
output is transformers' and sampled output keeps its distribution; the narrowed head's logits are
the whole head's columns in every torch format; the chosen ids, the errors and the start-up line."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from qwen_serve import LLM, SamplingParams
from qwen_serve.checkpoints.checkpoint import load_checkpoint
from qwen_serve.conformance.models import add_mtp_head, make_qwen3_5_checkpoint
from qwen_serve.conformance.reference import hf_greedy, hf_mtp_drafts
from qwen_serve.engine.draft_vocabulary import draft_vocabulary
from qwen_serve.errors import ModelLoadError

NARROW = 4096  # of Qwen3's 151,936: a random head's whole-vocabulary guess is almost never among them
ADDED = 26  # Qwen3's tokenizer's added tokens (151,643 to 151,668), kept beside any choice


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    directory = make_qwen3_5_checkpoint(tmp_path_factory.mktemp("narrow"), seed=3)
    return add_mtp_head(directory, seed=3)


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_drafts_equal_transformers_head_among_the_kept_tokens(checkpoint, backend):
    llm = LLM(str(checkpoint), backend=backend, chunk_size=16, speculative="mtp", num_speculative_tokens=3,
              draft_vocab=NARROW)
    kept = draft_vocabulary(NARROW, llm.parts.tokenizer, llm.parts.model_config.vocab_size).tolist()
    engine = llm.engine
    prompts = [list(range(100, 140)), list(range(1, 8))]
    seqs = [engine.add_request(f"r{i}", p, SamplingParams(max_tokens=8, ignore_eos=True)) for i, p in enumerate(prompts)]
    compared = narrowed = 0
    while engine.has_unfinished():
        engine.step()
        for seq in seqs:
            if seq.next_draft:
                ids, k = seq.token_ids(), len(seq.next_draft)
                assert seq.next_draft == hf_mtp_drafts(checkpoint, ids, k, vocabulary=kept)
                narrowed += seq.next_draft != hf_mtp_drafts(checkpoint, ids, k)
                compared += 1
    assert compared >= 6 and narrowed >= compared // 2


@pytest.mark.parametrize("backend", ["torch", "mlx"])
def test_greedy_output_is_transformers_with_a_narrowed_head(checkpoint, backend, tmp_path):
    ids = tmp_path / "ids.json"
    ids.write_text(json.dumps(list(range(0, 20000, 3))))
    llm = LLM(str(checkpoint), backend=backend, chunk_size=16, speculative="mtp", num_speculative_tokens=2,
              draft_vocab=str(ids))
    prompts = [list(range(1, 8)), list(range(100, 140))]
    for prompt, out in zip(prompts, llm.generate(prompts, SamplingParams(max_tokens=10, ignore_eos=True))):
        assert out.token_ids == hf_greedy(checkpoint, prompt, 10)
    assert llm.engine.stats.draft_tokens_total > 0
    assert llm.parts.executor.draft_scoring()[0] == len(range(0, 20000, 3)) + ADDED


def test_int4_with_a_narrowed_head_decodes_as_int4_without_speculation(checkpoint, monkeypatch, tmp_path):
    monkeypatch.setenv("QWEN_SERVE_CACHE", str(tmp_path))
    monkeypatch.setenv("QWEN_SERVE_KERNELS", "int4=kernel,int6=kernel,int8=kernel")
    prompt = list(range(1, 30))
    params = SamplingParams(max_tokens=8, ignore_eos=True)
    drafting = LLM(str(checkpoint), quant="int4", speculative="mtp", num_speculative_tokens=2, draft_vocab=NARROW)
    plain = LLM(str(checkpoint), quant="int4")
    assert drafting.generate([prompt], params)[0].token_ids == plain.generate([prompt], params)[0].token_ids
    assert drafting.engine.stats.draft_tokens_total > 0
    tokens, head_bytes = drafting.parts.executor.draft_scoring()
    assert tokens == NARROW + ADDED and head_bytes < plain.parts.executor.lm_head.nbytes() / 20


def test_sampled_output_with_a_narrowed_head_keeps_the_distribution(tmp_path):
    """Check 7 on the 4-token hybrid with the head guessing only tokens 0 and 2: a draft of 1 or 3
    is never made, and the first tokens of 4,000 seeded requests still follow transformers'
    exact joint distribution."""
    from dataclasses import replace

    from qwen_serve.conformance import speculation
    from qwen_serve.conformance.models import QWEN3_5_TINY

    directory = make_qwen3_5_checkpoint(tmp_path, replace(QWEN3_5_TINY, vocab_size=speculation.VOCAB), seed=7,
                                        init_std=0.1)
    add_mtp_head(directory, seed=7, init_std=0.1)
    ids = tmp_path / "ids.txt"
    ids.write_text("0\n2\n")
    llm = LLM(str(directory), speculative="mtp", num_speculative_tokens=speculation.SPECULATIVE_TOKENS, max_batch=64,
              draft_vocab=str(ids))
    proposed = []
    draft = llm.engine.executor.draft
    llm.engine.executor.draft = lambda requests, cache: [proposed.extend(d) or d for d in draft(requests, cache)]
    sampled = speculation.sample_joint(llm)
    statistic, df, p_value = speculation.chi_square(sampled.counts, speculation.exact_joint(directory))
    assert set(proposed) == {0, 2} and 0 < sampled.accepted < sampled.drafts
    assert p_value > speculation.ALPHA, f"chi2 {statistic:.1f} on {df} df, p = {p_value:.2g}"


def _torch_head(kind: str, weight: torch.Tensor):
    from qwen_serve.backends.torch_cpu.int4_linear import Int4Linear, Int6Linear, Int8Linear
    from qwen_serve.backends.torch_cpu.linear import DenseLinear
    from qwen_serve.backends.torch_cpu.native import load_kernels
    from qwen_serve.quant import int4

    if kind in ("float32", "bfloat16"):
        head = DenseLinear(weight.to(getattr(torch, kind)))
        head.as_head(load_kernels())
        return head
    return Int4Linear(int4.quantize(weight.numpy())) if kind == "int4" else \
        {"int6": Int6Linear, "int8": Int8Linear}[kind](weight)


@pytest.mark.parametrize("kind", ["float32", "bfloat16", "int4", "int6", "int8"])
def test_a_narrowed_torch_head_gives_the_whole_heads_columns(kind):
    torch.manual_seed(0)
    head = _torch_head(kind, torch.randn(1000, 128) * 0.05)
    ids = torch.tensor([0, 3, 16, 17, 500, 999])
    x = torch.randn(3, 128)
    narrowed = head.with_rows(ids)
    if hasattr(narrowed, "as_head"):
        narrowed.as_head(head.kernels)
    assert narrowed.out_features == len(ids)
    assert torch.equal(narrowed(x), head(x)[:, ids])


def test_the_kept_ids_are_the_lowest_or_the_files_with_the_added_tokens(checkpoint, tmp_path):
    tokenizer = load_checkpoint(checkpoint).tokenizer
    added = tokenizer.added_token_ids
    assert tokenizer.token_to_id("<|im_end|>") in added and tokenizer.token_to_id("</think>") in added
    assert draft_vocabulary(100, tokenizer, 151936).tolist() == list(range(100)) + added
    assert draft_vocabulary("100", tokenizer, 151936).tolist() == list(range(100)) + added
    listed = tmp_path / "ids.txt"
    listed.write_text("7 5\n5\n9\n")
    assert draft_vocabulary(str(listed), tokenizer, 151936).tolist() == [5, 7, 9] + added
    assert draft_vocabulary(str(listed), tokenizer, 151643).tolist() == [5, 7, 9]  # added ids past a vocabulary go


@pytest.mark.parametrize("content, needle", [
    (None, "cannot read it"),
    ("[1, 2, \"x\"]", "expected token ids"),
    ("", "holds no token ids"),
    ("[1, 151936]", "token id 151936 is outside the vocabulary"),
    ("-3", "token id -3 is outside"),
])
def test_a_bad_file_of_ids_is_a_one_line_error(checkpoint, tmp_path, content, needle):
    path = tmp_path / "ids"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=needle):
        draft_vocabulary(str(path), load_checkpoint(checkpoint).tokenizer, 151936)


def test_a_number_outside_the_vocabulary_and_a_head_less_proposer_are_errors(checkpoint):
    with pytest.raises(ValueError, match="between 1 and 151,935"):
        LLM(str(checkpoint), speculative="mtp", draft_vocab=151936)
    for options in ({}, {"speculative": "ngram"}):
        with pytest.raises(ModelLoadError, match="narrows what a draft head guesses"):
            LLM(str(checkpoint), draft_vocab=NARROW, **options)
    with pytest.raises(ValueError, match="draft_vocab must be"):
        LLM(str(checkpoint), speculative="mtp", draft_vocab=0)


def test_the_start_up_plan_says_what_drafts_are_scored_over(checkpoint):
    from qwen_serve.server.memory_plan import format_memory_plan

    narrowed = LLM(str(checkpoint), speculative="mtp", num_speculative_tokens=3, draft_vocab=NARROW)
    line = next(x for x in format_memory_plan(narrowed.parts, "float32", "none").splitlines() if x.startswith("speculate"))
    head = narrowed.parts.executor.draft_scoring()[1] / 2**20
    assert "mtp, up to 3 drafts" in line and f"over {NARROW + ADDED:,} of 151,936 tokens" in line and f"{head:,.1f} MiB" in line
    whole = LLM(str(checkpoint), speculative="mtp")
    line = next(x for x in format_memory_plan(whole.parts, "float32", "none").splitlines() if x.startswith("speculate"))
    assert "scored over" not in line
    assert np.isclose(narrowed.parts.executor.draft_scoring()[1] * 151936 / (NARROW + ADDED),
                      whole.parts.executor.draft_scoring()[1], rtol=0.01)


def test_the_draft_vocab_command_ranks_ones_own_text(checkpoint, tmp_path):
    """`qwen-serve draft-vocab`: coverage of the lowest ids and of the commonest tokens on held-out
    halves, and the commonest ids written for --draft-vocab FILE."""
    import subprocess
    import sys
    from collections import Counter

    text = tmp_path / "replies.txt"
    text.write_text("的 こんにちは Zyzzyva " * 300 + "ordinary words and more ordinary words " * 50)
    out = tmp_path / "ids.json"
    proc = subprocess.run([sys.executable, "-m", "qwen_serve", "draft-vocab", "--model", str(checkpoint), str(text),
                           "--size", "8", "100", "-o", str(out)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    tokens = load_checkpoint(checkpoint).tokenizer.encode(text.read_text(), add_special_tokens=False)
    counts = Counter(tokens)
    expected = sorted(sorted(counts, key=lambda t: (-counts[t], t))[:8])
    assert json.loads(out.read_text()) == expected
    row = next(line for line in proc.stdout.splitlines() if line.startswith("| 8 |"))
    lowest, ranked = (float(cell.strip().rstrip("%")) for cell in row.strip("|").split("|")[1:])
    first, second = tokens[:len(tokens) // 2], tokens[len(tokens) // 2:]
    first_counts = Counter(first)
    ranked_on_first = sorted(first_counts, key=lambda t: (-first_counts[t], t))[:8]
    assert ranked == pytest.approx(100 * sum(t in ranked_on_first for t in second) / len(second), abs=0.05)
    assert lowest == pytest.approx(100 * sum(t < 8 for t in second) / len(second), abs=0.05) and lowest < ranked
    bad = subprocess.run([sys.executable, "-m", "qwen_serve", "draft-vocab", "--model", str(checkpoint), str(text),
                          "--size", "0"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and "between 1 and" in bad.stderr.strip() and len(bad.stderr.strip().splitlines()) == 1
