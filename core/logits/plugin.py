"""The built-in logits processors, registered through the same hook a plugin's processors use."""
from __future__ import annotations

from ..checkpoints.tokenizer import Tokenizer
from ..hookspecs import hookimpl
from ..models.config import ModelConfig
from ..protocols import LogitsProcessor
from .penalties import LogitBias, MinTokens, Penalties
from .structured import StructuredOutputs
from .thinking_budget import ThinkingBudget

BUILTIN_FACTORIES = {
    "penalties": lambda model_config, tokenizer: Penalties(model_config),
    "logit_bias": lambda model_config, tokenizer: LogitBias(model_config),
    "min_tokens": lambda model_config, tokenizer: MinTokens(model_config),
    "structured_output": StructuredOutputs,
    "thinking_budget": ThinkingBudget,
}


def builtin_logits_processors(model_config: ModelConfig, tokenizer: Tokenizer) -> list[LogitsProcessor]:
    """For an Engine built without a plugin registry."""
    return [factory(model_config, tokenizer) for factory in BUILTIN_FACTORIES.values()]


@hookimpl
def register_logits_processors(register):
    for name, factory in BUILTIN_FACTORIES.items():
        register(name, factory)
