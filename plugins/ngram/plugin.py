"""Registers the n-gram proposer as ``--speculative ngram``, through the hook any proposer
plugin uses (a draft-model proposer would register the same way)."""
from __future__ import annotations

from qwen_serve.hookspecs import hookimpl

from .proposer import NgramProposer


@hookimpl
def register_proposers(register):
    register("ngram", lambda engine_config: NgramProposer())
