"""Sampling in the fixed order of SPEC §3: temperature 0 -> argmax; otherwise
logits / T -> top-k -> softmax -> top-p (at least one token kept) -> one draw from the
request's own generator."""
from __future__ import annotations

from typing import Sequence

import torch

from qwen_serve.engine.sampling_params import SamplingParams
from qwen_serve.protocols import SampleResult


class TorchSampler:
    def make_generator(self, seed: int) -> torch.Generator:
        generator = torch.Generator()
        generator.manual_seed(seed)
        return generator

    def sample(
        self, logits: torch.Tensor, params: Sequence[SamplingParams], generators: Sequence[torch.Generator]
    ) -> SampleResult:
        logits = logits.float()
        tokens: list[int] = []
        logprobs: list[dict[int, float] | None] = []
        for row, p, generator in zip(logits, params, generators):
            token = int(torch.argmax(row)) if p.greedy else self._draw(row, p, generator)
            tokens.append(token)
            logprobs.append(None if p.logprobs is None else top_logprobs(row, p.logprobs, token))
        return SampleResult(tokens, logprobs)

    @staticmethod
    def _draw(row: torch.Tensor, p: SamplingParams, generator: torch.Generator) -> int:
        # float64 and max-subtracted: a temperature as small as 1e-300 must not overflow to NaN
        scaled = (row.double() - row.max()) / p.temperature
        if 0 < p.top_k < scaled.numel():
            kth = torch.topk(scaled, p.top_k).values[-1]
            scaled = scaled.masked_fill(scaled < kth, float("-inf"))
        probs = torch.softmax(scaled, dim=-1)
        if p.top_p < 1.0:
            sorted_probs, order = torch.sort(probs, descending=True)
            mass_before = torch.cumsum(sorted_probs, dim=-1) - sorted_probs
            sorted_probs = sorted_probs.masked_fill(mass_before >= p.top_p, 0.0)  # index 0 always stays
            probs = torch.zeros_like(probs).scatter_(0, order, sorted_probs)
        return int(torch.multinomial(probs, 1, generator=generator))


def top_logprobs(row: torch.Tensor, k: int, chosen: int) -> dict[int, float]:
    """The model's log-probabilities (before temperature or filters): top k plus the chosen token."""
    logp = torch.log_softmax(row, dim=-1)
    out = {chosen: float(logp[chosen])}
    if k > 0:
        values, ids = torch.topk(logp, k)
        out.update(zip(ids.tolist(), values.tolist()))
    return out
