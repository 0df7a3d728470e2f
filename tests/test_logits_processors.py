"""The sampling fields of SamplingParams: each changes output as documented, the
numbers agree with their definitions (transformers for the repetition penalty), the adjustment
applies them in order, and a plugin can add its own processor through the hook."""
from __future__ import annotations

from collections import Counter
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from qwen_serve import LLM, SamplingParams
from qwen_serve.backends.torch_cpu.sampler import TorchSampler
from qwen_serve.errors import InvalidRequest
from qwen_serve.hookspecs import hookimpl
from qwen_serve.logits.penalties import LogitBias, MinTokens, Penalties
from qwen_serve.protocols import LogitsProcessor, LogitsState
from qwen_serve.registry import load_registry, make_plugin_manager
from qwen_serve.sampling.adjustment import BatchAdjustment, LogitsAdjustment
from qwen_serve.sampling.rule import adjusted_logits, weights

VOCAB = 64


def config(vocab=VOCAB, eos=(2,)):
    return SimpleNamespace(vocab_size=vocab, eos_token_ids=eos)


def request(prompt, output, **params):
    return SimpleNamespace(prompt_token_ids=list(prompt), output_token_ids=list(output), params=SamplingParams(**params))


def apply_adjustment(logits: torch.Tensor, batch: BatchAdjustment) -> torch.Tensor:
    return torch.from_numpy(adjusted_logits(logits.numpy(), batch))


def adjusted(logits: torch.Tensor, processor, requests) -> torch.Tensor:
    rows = []
    for req in requests:
        state = processor.start(req)
        rows.append(None if state is None else state.adjust(req))
    batch = BatchAdjustment.of_rows(rows)
    return logits if batch is None else apply_adjustment(logits, batch)


# --- the definitions, on fixed logits -----------------------------------------------------------
def test_repetition_penalty_equals_transformers():
    from transformers import RepetitionPenaltyLogitsProcessor

    torch.manual_seed(0)
    logits = torch.randn(3, VOCAB) * 4
    prompts = [[1, 5, 5, 9], [3, 4], [7]]
    outputs = [[9, 10, 11], [4, 4, 20], [8]]
    penalty = 1.3
    ours = adjusted(logits, Penalties(config()), [request(p, o, repetition_penalty=penalty)
                                                  for p, o in zip(prompts, outputs)])
    for row, (p, o) in enumerate(zip(prompts, outputs)):
        theirs = RepetitionPenaltyLogitsProcessor(penalty)(torch.tensor([p + o]), logits[row:row + 1].clone())
        assert torch.equal(ours[row], theirs[0])
    assert not torch.equal(ours, logits)


def test_presence_and_frequency_follow_openai_over_generated_tokens_only():
    logits = torch.zeros(1, VOCAB)
    prompt, output = [30, 30, 31], [5, 5, 5, 6]
    ours = adjusted(logits, Penalties(config()), [request(prompt, output, presence_penalty=0.5, frequency_penalty=0.25)])
    expected = torch.zeros(VOCAB)
    for token, count in Counter(output).items():
        expected[token] -= 0.25 * count + 0.5
    assert torch.allclose(ours[0], expected)
    assert ours[0, 30] == 0 and ours[0, 31] == 0  # the prompt's tokens are not penalized


def test_logit_bias_adds_and_min_tokens_suppresses_eos_and_stop_tokens():
    logits = torch.zeros(2, VOCAB)
    bias = adjusted(logits, LogitBias(config()), [request([1], [], logit_bias={3: 7.5, 4: -100}), request([1], [])])
    assert bias[0, 3] == 7.5 and bias[0, 4] == -100 and bias[0, :3].eq(0).all() and bias[1].eq(0).all()
    suppress = MinTokens(config(eos=(2,)))
    early = adjusted(logits, suppress, [request([1], [7], min_tokens=3, stop_token_ids=[9]),
                                        request([1], [7, 7, 7], min_tokens=3, stop_token_ids=[9])])
    assert torch.isneginf(early[0, 2]) and torch.isneginf(early[0, 9]) and early[0].isfinite().sum() == VOCAB - 2
    assert early[1].eq(0).all()  # three tokens generated: nothing suppressed any more
    ignoring = adjusted(logits, suppress, [request([1], [], min_tokens=3, ignore_eos=True, stop_token_ids=[9])])
    assert ignoring[0, 2] == 0 and torch.isneginf(ignoring[0, 9])


def test_merged_adjustments_compose_like_one_after_the_other():
    a = LogitsAdjustment(penalty_ids=np.array([1, 2]), penalty_factors=np.array([2.0, 2.0], np.float32),
                         bias_ids=np.array([1]), bias_values=np.array([1.0], np.float32),
                         allowed=np.array([0b0110], np.int32))
    b = LogitsAdjustment(penalty_ids=np.array([2]), penalty_factors=np.array([3.0], np.float32),
                         bias_ids=np.array([1, 3]), bias_values=np.array([0.5, -1.0], np.float32),
                         allowed=np.array([0b1100], np.int32))
    merged = LogitsAdjustment.merge([a, b])
    logits = torch.tensor([[4.0, 4.0, -6.0, 1.0] + [0.0] * 28])
    out = apply_adjustment(logits, BatchAdjustment.of_rows([merged]))[0]
    assert out[1] == float("-inf") and out[3] == float("-inf") and out[0] == float("-inf")  # only token 2 allowed
    assert out[2] == -6.0 * 2 * 3


def test_min_p_removes_tokens_below_min_p_times_the_top_probability():
    probs = torch.tensor([0.40, 0.30, 0.15, 0.09, 0.06])
    left = torch.from_numpy(weights(probs.log().numpy(), SamplingParams(temperature=1.0, min_p=0.25)))
    kept = left / left.sum()
    assert (left[3:] == 0).all()  # 0.09 and 0.06 < 0.25 * 0.40
    assert torch.allclose(kept[:3], (probs[:3] / probs[:3].sum()).double())
    sampler = TorchSampler()
    generator = sampler.make_generator(0)
    draws = {sampler.sample(probs.log()[None], [SamplingParams(temperature=1.0, min_p=0.25)], [generator]).token_ids[0]
             for _ in range(300)}
    assert draws == {0, 1, 2}


def test_greedy_rows_see_the_adjustment():
    logits = torch.tensor([[0.0, 5.0, 1.0, 0.0]])
    sampler = TorchSampler()
    batch = BatchAdjustment.of_rows([LogitsAdjustment(bias_ids=np.array([2]), bias_values=np.array([10.0], np.float32))])
    plain = sampler.sample(logits, [SamplingParams()], [sampler.make_generator(0)], adjustment=None)
    biased = sampler.sample(logits, [SamplingParams(logprobs=1)], [sampler.make_generator(0)], adjustment=batch)
    assert plain.token_ids == [1] and biased.token_ids == [2]
    assert biased.logprobs[0][1] > biased.logprobs[0][2]  # logprobs stay the model's own


def test_the_adjustment_applies_penalties_then_biases_then_masks():
    rng = np.random.default_rng(1)
    logits = rng.normal(size=(3, 70)).astype(np.float32) * 3
    mask = np.zeros(3, np.int32)
    mask[0], mask[1] = 0b1011_0110, -1
    rows = [LogitsAdjustment(penalty_ids=np.array([0, 1, 4]), penalty_factors=np.full(3, 1.7, np.float32),
                             bias_ids=np.array([4, 69]), bias_values=np.array([2.5, -np.inf], np.float32),
                             allowed=mask),
            None,
            LogitsAdjustment(bias_ids=np.array([3]), bias_values=np.array([-100.0], np.float32))]
    ours = adjusted_logits(logits, BatchAdjustment.of_rows(rows))
    expected = logits.copy()  # entry by entry, in the documented order
    for row, a in enumerate(rows):
        if a is None:
            continue
        for token, factor in zip(a.penalty_ids, a.penalty_factors):
            x = expected[row, token]
            expected[row, token] = x * factor if x < 0 else x / factor
        for token, bias in zip(a.bias_ids, a.bias_values):
            expected[row, token] += bias
        if a.allowed is not None:
            for token in range(70):
                if not (int(a.allowed[token // 32]) >> (token % 32)) & 1:
                    expected[row, token] = -np.inf
    np.testing.assert_array_equal(ours, expected)
    np.testing.assert_array_equal(ours[1], logits[1])
    assert np.isneginf(ours[0, [0, 3, 6, 8, 69]]).all() and np.isfinite(ours[0, [1, 2, 4, 5, 7]]).all()


def test_mlx_min_p_draws_only_kept_tokens():
    from qwen_serve.backends.mlx.mx import mx
    from qwen_serve.backends.mlx.sampler import MLXSampler

    sampler = MLXSampler()
    key = sampler.make_generator(3)
    logits = mx.array(np.log(np.array([[0.40, 0.30, 0.15, 0.09, 0.06]], np.float32)))
    params = SamplingParams(temperature=1.0, min_p=0.25)
    assert {sampler.sample(logits, [params], [key]).token_ids[0] for _ in range(150)} == {0, 1, 2}


@pytest.mark.parametrize("penalty", [5e-324, 1e-40, 1e300])
def test_extreme_repetition_penalties_keep_logits_finite_and_sampling_working(penalty):
    """Any finite penalty > 0 is valid; one far below float32's range must not turn a seen
    token's logit into inf (or 0 / 0 into NaN) and sampling into an error, on either backend."""
    from qwen_serve.backends.mlx.mx import mx
    from qwen_serve.backends.mlx.sampler import MLXSampler

    logits = torch.randn(2, VOCAB, generator=torch.Generator().manual_seed(4)) * 4
    logits[0, 5] = 0.0
    reqs = [request([1, 5, 9], [3], repetition_penalty=penalty, temperature=1e-300),
            request([7], [8, 8], repetition_penalty=penalty, temperature=1.0)]
    rows = []
    for req in reqs:
        state = Penalties(config()).start(req)
        rows.append(state.adjust(req))
    batch = BatchAdjustment.of_rows(rows)
    ours = apply_adjustment(logits, batch)
    assert torch.isfinite(ours).all()
    params = [r.params for r in reqs]
    for sampler, rows_in in ((TorchSampler(), logits), (MLXSampler(), mx.array(logits.numpy()))):
        generators = [sampler.make_generator(i) for i in range(2)]
        tokens = sampler.sample(rows_in, params, generators, adjustment=batch).token_ids
        assert all(0 <= t < VOCAB for t in tokens)
        top = torch.nonzero(ours[0] == ours[0].max()).flatten().tolist()  # several, when clamped to float32's max
        assert tokens[0] in top  # a temperature of 1e-300 draws a top token


def test_out_of_vocabulary_ids_are_invalid_requests():
    with pytest.raises(InvalidRequest, match="logit_bias: token id 64 is outside"):
        LogitBias(config()).validate(SamplingParams(logit_bias={64: 1.0}))
    with pytest.raises(InvalidRequest, match="stop_token_ids: token id 99"):
        MinTokens(config()).validate(SamplingParams(stop_token_ids=[99]))


# --- through the engine on SmolLM2 --------------------------------------------------------------
@pytest.fixture(scope="module")
def llm(smollm2_path):
    return LLM(str(smollm2_path))


def chat(llm, text):
    return llm.tokenizer.encode_chat([{"role": "user", "content": text}])


def test_logit_bias_forces_and_removes_greedy_choices(llm):
    prompt = chat(llm, "Describe a person as JSON with name and age.")
    free = llm.generate([prompt], SamplingParams(max_tokens=6))[0].token_ids
    forced = llm.generate([prompt], SamplingParams(max_tokens=4, logit_bias={42: 100}))[0].token_ids
    assert forced == [42] * 4 and free[0] != 42
    other = llm.generate([prompt], SamplingParams(max_tokens=6, logit_bias={free[0]: -100}))[0].token_ids
    assert other[0] != free[0]


@pytest.mark.parametrize("penalty", [{"frequency_penalty": 1.0}, {"presence_penalty": 2.0}])
def test_penalties_reduce_repeats(llm, penalty):
    prompt = chat(llm, "Write the word banana ten times.")
    params = dict(max_tokens=48, ignore_eos=True)
    free = Counter(llm.generate([prompt], SamplingParams(**params))[0].token_ids)
    penalized = Counter(llm.generate([prompt], SamplingParams(**params, **penalty))[0].token_ids)
    assert free.most_common(1)[0][1] >= 12  # SmolLM2 repeats "Banana," over and over
    assert penalized.most_common(1)[0][1] <= free.most_common(1)[0][1] // 2
    assert len(penalized) > 2 * len(free)


def test_repetition_penalty_changes_greedy_output(llm):
    prompt = chat(llm, "Write the word banana ten times.")
    free = llm.generate([prompt], SamplingParams(max_tokens=32, ignore_eos=True))[0].token_ids
    penalized = llm.generate([prompt], SamplingParams(max_tokens=32, ignore_eos=True, repetition_penalty=1.3))[0].token_ids
    assert max(Counter(penalized).values()) < max(Counter(free).values()) // 3


def test_stop_token_ids_end_the_text_before_the_token(llm):
    prompt = chat(llm, "Hi")
    free = llm.generate([prompt], SamplingParams(max_tokens=30))[0]
    stop = free.token_ids[3]
    assert stop not in free.token_ids[:3]
    out = llm.generate([prompt], SamplingParams(max_tokens=30, stop_token_ids=[stop]))[0]
    assert out.token_ids == free.token_ids[:4] and out.finish_reason == "stop"
    assert out.text == llm.tokenizer.decode(free.token_ids[:3])


def test_min_tokens_holds_eos_back_and_ignore_eos_runs_to_max_tokens(llm):
    prompt = chat(llm, "Hi")
    eos = set(llm.config.eos_token_ids)
    free = llm.generate([prompt], SamplingParams(max_tokens=30))[0]
    assert free.finish_reason == "stop" and len(free.token_ids) < 15 and free.token_ids[-1] in eos
    held = llm.generate([prompt], SamplingParams(max_tokens=30, min_tokens=20))[0]
    assert len(held.token_ids) >= 20 and not eos & set(held.token_ids[:20])
    assert held.token_ids[:len(free.token_ids) - 1] == free.token_ids[:-1]
    through = llm.generate([prompt], SamplingParams(max_tokens=30, ignore_eos=True))[0]
    assert len(through.token_ids) == 30 and through.finish_reason == "length"
    assert eos & set(through.token_ids[:-1])  # it generated EOS and went on


def test_min_tokens_holds_stop_strings_back_too(llm):
    prompt = chat(llm, "Hi")
    assert llm.generate([prompt], SamplingParams(max_tokens=30, stop="!"))[0].text == "Hello"
    held = llm.generate([prompt], SamplingParams(max_tokens=30, stop=["!", "?"], min_tokens=5))[0]
    assert held.text == "Hello! How can I assist you today" and held.finish_reason == "stop"


def test_seeded_penalized_rows_are_batch_invariant(llm):
    prompts = [chat(llm, t) for t in ("Write the word banana ten times.", "Hi", "Name three colors.")]
    params = SamplingParams(temperature=0.9, seed=11, max_tokens=20, ignore_eos=True, presence_penalty=0.7,
                            frequency_penalty=0.3, repetition_penalty=1.1, logit_bias={11: -5.0}, min_p=0.05)
    alone = llm.generate([prompts[0]], params)[0].token_ids
    plain = SamplingParams(temperature=0.9, seed=11, max_tokens=20, ignore_eos=True)
    seqs = llm.engine.run([("a", prompts[0], params), ("b", prompts[1], plain), ("c", prompts[2], params)])
    assert seqs[0].output_token_ids == alone
    assert seqs[1].output_token_ids == llm.generate([prompts[1]], plain)[0].token_ids


# --- a plugin's processor -------------------------------------------------------------------------
class NoToken:
    """Masks one token out of every request whose prompt contains a marker token."""

    def __init__(self, vocab_size: int, marker: int, banned: int) -> None:
        self.words, self.marker, self.banned = -(-vocab_size // 32), marker, banned

    def validate(self, params):
        pass

    def start(self, request):
        if self.marker not in request.prompt_token_ids:
            return None
        allowed = np.ones(self.words * 32, dtype=bool)
        allowed[self.banned] = False
        return NoTokenState(LogitsAdjustment(allowed=np.packbits(allowed, bitorder="little").view(np.int32)))


class NoTokenState:
    def __init__(self, adjustment):
        self.adjustment = adjustment

    def adjust(self, request):
        return self.adjustment

    def accept(self, token_id):
        pass


def test_a_plugin_processor_applies_to_the_requests_it_chooses(qwen3_tiny):
    probe = LLM(str(qwen3_tiny))
    prompts = [probe.tokenizer.encode(t) for t in ("marked: hello there", "plain: hello there")]
    marker = prompts[0][0]
    assert marker not in prompts[1]
    greedy = SamplingParams(max_tokens=8, ignore_eos=True)
    free = [o.token_ids for o in probe.generate(prompts, greedy)]
    banned = free[0][0]

    class Plugin:
        @staticmethod
        @hookimpl
        def register_logits_processors(register):
            register("no-token", lambda model_config, tokenizer: NoToken(model_config.vocab_size, marker, banned))

    pm = make_plugin_manager(env={"QWEN_SERVE_PLUGINS": ""})
    pm.register(Plugin, name="no-token-plugin")
    try:
        registry = load_registry(pm=pm)
        assert list(registry.logits_processors)[-1] == "no-token"
        llm = LLM(str(qwen3_tiny), registry=registry)
        processor = llm.engine.logits.processors[-1]
        assert isinstance(processor, LogitsProcessor) and isinstance(NoTokenState(None), LogitsState)
        outs = [o.token_ids for o in llm.generate(prompts, greedy)]
    finally:
        pm.unregister(name="no-token-plugin")
    assert banned not in outs[0] and outs[0] != free[0]
    assert outs[1] == free[1]  # the unmarked request is untouched
