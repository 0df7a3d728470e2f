"""How much KV a request's n choices need when they fork one prompt (copy-on-write)."""
from __future__ import annotations


def blocks_for_choices(prompt_tokens: int, max_tokens: int, n: int, block_size: int) -> int:
    """The prompt's full blocks once, shared, plus each choice's own blocks from the prompt's last
    partly filled block (copied on its first write) to prompt + max_tokens."""
    shared = prompt_tokens // block_size
    per_choice = -(-(prompt_tokens + max_tokens) // block_size) - shared
    return shared + n * per_choice
