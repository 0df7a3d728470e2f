"""Check 7 must be able to fail: the same statistics on deliberately wrong acceptance rules
(always keep the draft; on rejection draw from p without removing the draft) reject them."""
from __future__ import annotations

import pytest

from qwen_serve import LLM
from qwen_serve.backends.torch_cpu.sampler import TorchSampler, float32_rows
from qwen_serve.conformance import speculation
from qwen_serve.sampling.rule import draw, weights


class AlwaysAccept(TorchSampler):
    def verify_draft(self, logits, params, generator, draft):
        return list(draft) + [draw(weights(float32_rows(logits)[len(draft)], params), generator)]


class ResampleWithTheDraft(TorchSampler):
    """Rejects with the right probability but draws the replacement from all of p."""

    def verify_draft(self, logits, params, generator, draft):
        rows, out = float32_rows(logits), []
        for i, token in enumerate(draft):
            probs = weights(rows[i], params)
            probs /= probs.sum()
            if generator.random() < probs[token]:
                out.append(int(token))
                continue
            return out + [draw(probs, generator)]
        return out + [draw(weights(rows[len(draft)], params), generator)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return str(speculation.write_model(tmp_path_factory.mktemp("check7")))


@pytest.fixture(scope="module")
def joint(model):
    joint = speculation.exact_joint(model)
    assert abs(sum(joint.values()) - 1) < 1e-9 and len(joint) == speculation.VOCAB ** speculation.LENGTH
    return joint


def p_value(model, joint, sampler=None, **options) -> float:
    llm = LLM(model, **options)
    if sampler is not None:
        llm.engine.sampler = sampler  # the verifier the engine calls for drafted chunks
    sampled = speculation.sample_joint(llm)
    return speculation.chi_square(sampled.counts, joint)[2]


@pytest.mark.parametrize("wrong", [AlwaysAccept, ResampleWithTheDraft])
def test_check_7_fails_on_a_wrong_acceptance_rule(model, joint, wrong):
    spec = dict(speculative="ngram", num_speculative_tokens=speculation.SPECULATIVE_TOKENS)
    assert p_value(model, joint, wrong(), **spec) < speculation.ALPHA


def test_check_7_passes_normal_decoding(model, joint):
    """The reference side of the test: plain sampling (no speculation) fits the exact distribution."""
    assert p_value(model, joint) > speculation.ALPHA
