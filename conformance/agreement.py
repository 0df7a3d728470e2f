"""Top-5 next-token agreement between a float model and a quantized one (check 6's measure, also
used by benchmarks/bench_quant.py).

Each prompt is measured at every position of the float model's own greedy answer: float's top 5
come with its answer, and the quantized model is asked for its top 5 on the same contexts
(prompt + the first k answer tokens). So the figure rests on hundreds of predictions instead of
one per prompt; the prompts' final positions alone are reported too, as on them alone the figure
moved by several points between equally good quantizers.
"""
from __future__ import annotations

from dataclasses import dataclass

from qwen_serve import SamplingParams

ANSWER_TOKENS = 16  # positions measured per prompt


@dataclass(frozen=True)
class Agreement:
    overall: float  # mean share of the five tokens the two top-5 sets have in common
    at_prompt_ends: float  # the same, over each prompt's final position only
    float_top1_kept: float  # how often float's most likely token is in the quantized top 5
    predictions: int

    def describe(self, prompts: int) -> str:
        return (f"{self.overall:.1%} top-5 agreement over {self.predictions} predictions ({prompts} prompts x "
                f"their float answers; {self.at_prompt_ends:.1%} at the prompts' ends alone; float top-1 in "
                f"int4 top-5 {self.float_top1_kept:.0%})")


def ranked(logprobs: dict[int, float]) -> list[int]:
    """The five most likely tokens of one position, most likely first."""
    return sorted(logprobs, key=logprobs.get, reverse=True)[:5]


def overlap(reference: list[list[int]], other: list[list[int]]) -> float:
    return sum(len(set(a) & set(b)) for a, b in zip(reference, other)) / (5 * len(reference))


def top5_agreement(float_llm, quantized_llm, prompts: list[list[int]], answer_tokens: int = ANSWER_TOKENS) -> Agreement:
    answers = float_llm.generate(prompts, SamplingParams(max_tokens=answer_tokens, temperature=0.0, logprobs=5))
    contexts, reference, at_end = [], [], []
    for prompt, answer in zip(prompts, answers):
        for k, logprobs in enumerate(answer.logprobs):
            contexts.append(prompt + answer.token_ids[:k])
            reference.append(ranked(logprobs))
            at_end.append(k == 0)
    outs = quantized_llm.generate(contexts, SamplingParams(max_tokens=1, logprobs=5))
    quantized = [ranked(o.logprobs[0]) for o in outs]
    ends = [i for i, end in enumerate(at_end) if end]
    return Agreement(
        overall=overlap(reference, quantized),
        at_prompt_ends=overlap([reference[i] for i in ends], [quantized[i] for i in ends]),
        float_top1_kept=sum(a[0] in b for a, b in zip(reference, quantized)) / len(reference),
        predictions=len(reference),
    )
