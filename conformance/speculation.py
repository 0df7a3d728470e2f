"""Check 7's statistics: the exact distribution of a tiny model's first tokens, the same tokens
sampled through the engine with speculation, and a chi-square test between the two.

The model has a vocabulary of 4 tokens, so the joint distribution of the first LENGTH emitted
tokens (4^LENGTH outcomes) is computed exactly by transformers (float64, never the code under
test) from every prefix. The prompt repeats, so the n-gram proposer proposes at nearly every
step and, with only 4 tokens, its guesses are kept often and rejected often: both branches of
the rejection rule and the extra token after fully kept drafts are exercised.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from qwen_serve import LLM, SamplingParams

VOCAB = 4
PROMPT = [0, 1, 2, 3, 0, 1, 2, 0, 1, 3, 2, 0, 1]
LENGTH = 4  # emitted tokens compared: the first comes from the prompt, the others from verified drafts
SPECULATIVE_TOKENS = 2
SAMPLES = 4000
ALPHA = 1e-3  # false-alarm rate: a correct implementation fails for 1 in 1000 choices of seeds
MIN_EXPECTED = 5.0  # cells expecting fewer samples are pooled (the chi-square approximation's rule)
TEMPERATURE = 1.0


def write_model(directory: Path) -> Path:
    from .models import Qwen3Geometry, make_qwen3_checkpoint

    return make_qwen3_checkpoint(directory, Qwen3Geometry(vocab_size=VOCAB), seed=7, init_std=0.1)


def exact_joint(model_dir: str | Path, prompt: Sequence[int] = PROMPT, length: int = LENGTH) -> dict[tuple[int, ...], float]:
    """P(first `length` tokens = t) for every t, by transformers in float64 at TEMPERATURE."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float64).eval()
    joint: dict[tuple[int, ...], float] = {(): 1.0}
    with torch.inference_mode():
        for _ in range(length):
            tails = list(joint)
            ids = torch.tensor([list(prompt) + list(t) for t in tails])
            probs = torch.softmax(model(ids).logits[:, -1, :] / TEMPERATURE, dim=-1)
            joint = {t + (v,): joint[t] * float(probs[i, v]) for i, t in enumerate(tails) for v in range(VOCAB)}
    return joint


@dataclass
class Sampled:
    counts: Counter
    drafts: int
    accepted: int


def sample_joint(llm: LLM, samples: int = SAMPLES, prompt: Sequence[int] = PROMPT, length: int = LENGTH) -> Sampled:
    """The first `length` tokens of `samples` requests, request i seeded with i."""
    engine = llm.engine
    drafts, accepted = engine.stats.draft_tokens_total, engine.stats.accepted_draft_tokens_total
    seqs = [engine.add_request(f"check7-{i}", list(prompt),
                               SamplingParams(temperature=TEMPERATURE, seed=i, max_tokens=length, ignore_eos=True))
            for i in range(samples)]
    while engine.has_unfinished():
        engine.step()
    counts = Counter(tuple(s.output_token_ids) for s in seqs)
    return Sampled(counts, engine.stats.draft_tokens_total - drafts, engine.stats.accepted_draft_tokens_total - accepted)


def chi_square(counts: Counter, joint: dict[tuple[int, ...], float]) -> tuple[float, int, float]:
    """(statistic, degrees of freedom, p-value) of the counts against the exact distribution."""
    from scipy.stats import chi2

    total = sum(counts.values())
    unknown = set(counts) - set(joint)
    if unknown:  # an outcome the model cannot produce (wrong length or token): no test needed
        return float("inf"), 0, 0.0
    observed, expected, pooled_o, pooled_e = [], [], 0, 0.0
    for outcome, p in joint.items():
        if total * p >= MIN_EXPECTED:
            observed.append(counts.get(outcome, 0))
            expected.append(total * p)
        else:
            pooled_o += counts.get(outcome, 0)
            pooled_e += total * p
    if pooled_e > 0:
        observed.append(pooled_o)
        expected.append(pooled_e)
    statistic = sum((o - e) ** 2 / e for o, e in zip(observed, expected))
    df = len(observed) - 1
    return statistic, df, float(chi2.sf(statistic, df))
