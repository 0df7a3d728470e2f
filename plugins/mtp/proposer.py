"""Self-speculation through the checkpoint's multi-token-prediction head (Qwen3.5 and its
successors carry one: mtp.* beside the decoder). The head reads the main model's final hidden
state at a position with the embedding of the token after it and predicts the token after that;
run on its own guesses it drafts several. The executor runs it (DraftHead); this proposer only
asks for it, so any backend that can run the head serves ``--speculative mtp``."""
from __future__ import annotations

from typing import Any, Sequence

from qwen_serve.errors import ModelLoadError
from qwen_serve.protocols import DraftHead, DraftRequest


class MtpProposer:
    def check_model(self, config: Any) -> None:
        if not config.head_draft_layers:
            raise ModelLoadError(f"--speculative mtp needs a checkpoint with a multi-token-prediction head; "
                                 f"{config.name} ({config.architecture}) declares none (mtp_num_hidden_layers)")

    def propose_after_step(self, executor: Any, cache: Any, requests: Sequence[DraftRequest]) -> list[list[int]]:
        if not isinstance(executor, DraftHead):
            raise ModelLoadError(f"{type(executor).__name__} cannot run a multi-token-prediction head")
        return executor.draft(requests, cache)
