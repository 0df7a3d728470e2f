"""The built-in proposer, registered through the same hook a plugin's proposers use (a draft
model proposer would register the same way)."""
from __future__ import annotations

from ..config import EngineConfig
from ..hookspecs import hookimpl
from .ngram import NgramProposer
from .protocols import Proposer

BUILTIN_PROPOSERS = {
    "ngram": lambda engine_config: NgramProposer(),
}


def builtin_proposer(name: str, engine_config: EngineConfig) -> Proposer:
    """For an Engine built without a plugin registry."""
    factory = BUILTIN_PROPOSERS.get(name)
    if factory is None:
        raise ValueError(f"unknown proposer {name!r}; built-in proposers: {', '.join(BUILTIN_PROPOSERS)}")
    return factory(engine_config)


@hookimpl
def register_proposers(register):
    for name, factory in BUILTIN_PROPOSERS.items():
        register(name, factory)
