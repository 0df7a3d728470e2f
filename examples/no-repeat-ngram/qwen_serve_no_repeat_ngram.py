"""An example third-party plugin: a logits processor that only the requests asking for it feel.
A request sends ``vllm_xargs={"no_repeat_ngram_size": N}`` and gets no n-gram of N tokens twice
in its prompt and output together (transformers' ``no_repeat_ngram_size``); every other
request runs as if the plugin were not there.

Written only against qwen-serve's public API: the hook marker, the TakesRequestArgs Protocol,
InvalidRequest and LogitsAdjustment. Installed, it is found through the `qwen_serve` entry point:

    pip install -e examples/no-repeat-ngram
    python -m qwen_serve
    curl localhost:8000/v1/completions -d '{"prompt": "a b a", "vllm_xargs": {"no_repeat_ngram_size": 2}}'

or offline: ``LLM().generate(prompts, SamplingParams(extra_args={"no_repeat_ngram_size": 2}))``.
"""
from __future__ import annotations

from collections import defaultdict

import numpy as np

from qwen_serve.errors import InvalidRequest
from qwen_serve.hookspecs import hookimpl
from qwen_serve.sampling.adjustment import LogitsAdjustment

SIZE = "no_repeat_ngram_size"


class NoRepeatNgram:
    """The processor: claims ``no_repeat_ngram_size`` and applies only where a request gives it."""

    request_arg_keys = (SIZE,)

    def check_request_args(self, args: dict) -> None:
        size = args[SIZE]
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InvalidRequest(f"vllm_xargs: {SIZE!r} must be an integer >= 1, got {size!r}", param="vllm_xargs")

    def validate(self, params) -> None:
        pass  # the engine passes this processor's arguments to check_request_args

    def start(self, request) -> "NoRepeatState | None":
        args = request.params.request_args(self.request_arg_keys)
        return NoRepeatState(args[SIZE], request.prompt_token_ids) if args else None


class NoRepeatState:
    """Every (N-1)-token context seen so far, with the tokens that followed it: after a context,
    those tokens would close an N-gram a second time, so they get -inf."""

    def __init__(self, size: int, prompt: list[int]) -> None:
        self.size = size
        self.tokens = list(prompt)
        self.followers: dict[tuple[int, ...], set[int]] = defaultdict(set)
        for end in range(size, len(self.tokens) + 1):
            self._record(end)

    def _record(self, end: int) -> None:
        """Note the N-gram that ends just before position end."""
        *context, last = self.tokens[end - self.size:end]
        self.followers[tuple(context)].add(last)

    def adjust(self, request) -> LogitsAdjustment | None:
        context = tuple(self.tokens[len(self.tokens) - self.size + 1:])
        banned = self.followers.get(context)
        if not banned:
            return None
        ids = np.array(sorted(banned), dtype=np.int64)
        return LogitsAdjustment(bias_ids=ids, bias_values=np.full(len(ids), -np.inf, dtype=np.float32))

    def accept(self, token_id: int) -> None:
        self.tokens.append(token_id)
        if len(self.tokens) >= self.size:
            self._record(len(self.tokens))


@hookimpl
def register_logits_processors(register):
    register("no_repeat_ngram", lambda model_config, tokenizer: NoRepeatNgram())
