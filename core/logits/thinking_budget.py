"""SamplingParams.thinking_budget: a think block that reaches its budget is closed by the
engine, the way Qwen documents for its thinking models: the block ends with a sentence that
tells the model to answer now, then ``</think>`` and a blank line, and the model writes its
answer after it. Each of those tokens is forced by a one-token mask, so any sampler writes them
and a grammar that starts after ``</think>`` starts on time.

The block is open when the prompt ends inside one (the generation prompt of Qwen3.5 opens it)
or once the reply writes ``<think>``; tokens inside it count against the budget.
"""
from __future__ import annotations

import numpy as np

from ..checkpoints.tokenizer import Tokenizer
from ..errors import InvalidRequest
from ..models.config import ModelConfig
from ..protocols import LogitsRequest
from ..sampling.adjustment import LogitsAdjustment
from ..sampling.params import SamplingParams

THINK, END_THINK = "<think>", "</think>"
EXIT_TEXT = "\n\nConsidering the limited time by the user, I have to give the solution based on the thinking directly now.\n"


class ThinkingBudget:
    def __init__(self, model_config: ModelConfig, tokenizer: Tokenizer) -> None:
        self.vocab_size = model_config.vocab_size
        self.start_id = tokenizer.token_to_id(THINK)
        self.end_id = tokenizer.token_to_id(END_THINK)
        if self.end_id is not None:
            self.closing = (tokenizer.encode(EXIT_TEXT, add_special_tokens=False) + [self.end_id]
                            + tokenizer.encode("\n\n", add_special_tokens=False))

    def validate(self, params: SamplingParams) -> None:
        if params.thinking_budget is not None and (self.start_id is None or self.end_id is None):
            raise InvalidRequest(f"this model's tokenizer has no {THINK} / {END_THINK} tokens to budget",
                                 param="thinking_budget")

    def start(self, request: LogitsRequest) -> "ThinkingBudgetState | None":
        if request.params.thinking_budget is None:
            return None
        prompt = request.prompt_token_ids
        opened = max((i for i, t in enumerate(prompt) if t == self.start_id), default=-1)
        closed = max((i for i, t in enumerate(prompt) if t == self.end_id), default=-1)
        return ThinkingBudgetState(self, request.params.thinking_budget, inside=opened > closed)


class ThinkingBudgetState:
    def __init__(self, budget: ThinkingBudget, limit: int, inside: bool) -> None:
        self.budget = budget
        self.limit = limit
        self.inside = inside
        self.spent = 0
        self.forced: list[int] = []  # the closing tokens still to write

    def adjust(self, request: LogitsRequest) -> LogitsAdjustment | None:
        if self.inside and not self.forced and self.spent >= self.limit:
            self.forced = list(self.budget.closing)
        if not self.forced:
            return None
        allowed = np.zeros((self.budget.vocab_size + 31) // 32, dtype=np.uint32)
        token = self.forced[0]
        allowed[token // 32] = np.uint32(1) << np.uint32(token % 32)
        return LogitsAdjustment(allowed=allowed.view(np.int32))

    def accept(self, token_id: int) -> None:
        if self.forced:  # a sampler that ignores masks (a test's scripted one) ends the forcing
            self.forced = self.forced[1:] if token_id == self.forced[0] else []
        if token_id == self.budget.end_id:
            self.inside = False
        elif token_id == self.budget.start_id:
            self.inside = True
        elif self.inside and not self.forced:
            self.spent += 1
