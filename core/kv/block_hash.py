"""Chained block hashes: h_i = H(h_{i-1}, the block's token ids), so equal hashes mean equal
whole prefixes, not just equal blocks."""
from __future__ import annotations

import hashlib
from array import array
from typing import Sequence

ROOT_HASH = b"qwen-serve-prefix-v1"


def hash_block(parent: bytes, token_ids: Sequence[int]) -> bytes:
    digest = hashlib.blake2b(parent, digest_size=16)
    digest.update(array("q", token_ids).tobytes())
    return digest.digest()


def chain_hashes(token_ids: Sequence[int], block_size: int, num_blocks: int, parent: bytes = ROOT_HASH,
                 first_block: int = 0) -> list[bytes]:
    """Hashes of full blocks first_block .. first_block + num_blocks - 1."""
    out = []
    for i in range(first_block, first_block + num_blocks):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size])
        out.append(parent)
    return out
