"""Which tokens a draft head may guess (``--draft-vocab``; the ability is NarrowsDraftVocabulary).

A byte-level BPE vocabulary numbers its tokens in the order their merges were learned, each
merge the most frequent pair left in the tokenizer's training text, so low ids are roughly the
common pieces: with Qwen3's tokenizer the 32,768 lowest ids cover ~94% of the tokens of English
prose and of Python, 58-61% of Chinese (docs/performance.md has the table). A file of ids ranked
by one's own traffic (``qwen-serve draft-vocab``) does better where that order does not fit. The tokenizer's added tokens
(<|im_end|>, <think>, </think>, <tool_call>, ...) are always kept: a reply ends or changes mode
through them, and a head that cannot guess them loses a draft at every such turn.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np


def draft_vocabulary(choice: int | str, tokenizer: Any, vocab_size: int) -> np.ndarray:
    """choice: N (the N lowest token ids) or the path of a file of token ids (a JSON list, or
    integers separated by white space) -> the sorted distinct ids a draft head scores, the
    tokenizer's added tokens among them. A ValueError says what is wrong in one line."""
    if isinstance(choice, int) or (isinstance(choice, str) and choice.isdigit()):
        count = int(choice)
        if not 0 < count < vocab_size:
            raise ValueError(f"--draft-vocab {count}: give a number of tokens between 1 and {vocab_size - 1:,} "
                             f"(the vocabulary has {vocab_size:,}), or a file of token ids")
        ids = np.arange(count)
    else:
        ids = _read_ids(Path(choice), vocab_size)
    added = [i for i in tokenizer.added_token_ids if i < vocab_size]
    return np.union1d(ids, np.asarray(added, dtype=np.int64)).astype(np.int64)


def _read_ids(path: Path, vocab_size: int) -> np.ndarray:
    try:
        text = path.read_text()
    except OSError as e:
        raise ValueError(f"--draft-vocab {path}: cannot read it ({e.strerror or e})") from None
    try:
        values = json.loads(text) if text.lstrip().startswith("[") else text.split()
        ids = np.asarray([int(v) for v in values], dtype=np.int64)
    except (ValueError, TypeError):
        raise ValueError(f"--draft-vocab {path}: expected token ids, a JSON list or integers separated "
                         f"by white space") from None
    if ids.size == 0:
        raise ValueError(f"--draft-vocab {path}: holds no token ids")
    outside = ids[(ids < 0) | (ids >= vocab_size)]
    if outside.size:
        raise ValueError(f"--draft-vocab {path}: token id {int(outside[0])} is outside the vocabulary "
                         f"(0 to {vocab_size - 1:,})")
    return np.unique(ids)
