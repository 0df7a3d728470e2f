"""Registers the multi-token-prediction proposer as ``--speculative mtp``."""
from __future__ import annotations

from qwen_serve.hookspecs import hookimpl

from .proposer import MtpProposer


@hookimpl
def register_proposers(register):
    register("mtp", lambda engine_config: MtpProposer())
