"""Activation statistics that tell int4 quantization which weights matter most.

An error in a weight costs in proportion to the activations it multiplies, and a model's hidden
states have a few channels far larger than the rest. So before quantizing, the float model reads
a short calibration text while every projection sums the squares of its inputs per column; the
mean squares become the ``importance`` that int4.quantize weighs its errors by (the idea of
llama.cpp's importance matrix and of AWQ). On SmolLM2 this lifted top-5 agreement with float from
73.7% (same search, unweighted) to 83.2% (``python benchmarks/bench_quant.py --only quality``).

The text is varied on purpose (prose, code, a list, numbers, dialogue, other languages) and has
nothing to do with the conformance prompts that measure the result.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ..cache_dir import cache_dir
from ..protocols import Calibratable

log = logging.getLogger("qwen_serve.calibration")

CALIBRATION_TEXTS = (
    "The river town woke slowly. Fishermen pulled their boats onto the gravel while the baker, who "
    "had been up since four, stacked warm loaves by the window. Nobody noticed the stranger until "
    "she asked, in careful English, where she might find the old lighthouse keeper.",

    'def merge_sorted(a, b):\n    """Merge two sorted lists into one sorted list."""\n'
    "    result, i, j = [], 0, 0\n    while i < len(a) and j < len(b):\n        if a[i] <= b[j]:\n"
    "            result.append(a[i]); i += 1\n        else:\n            result.append(b[j]); j += 1\n"
    "    return result + a[i:] + b[j:]\n",

    "Shopping list for the weekend: 2 kg potatoes, 6 eggs, a litre of milk, 250 g butter, fresh "
    "basil, 3 lemons, olive oil, and coffee beans (medium roast).",

    "In 1969, Apollo 11 landed on the Moon. Neil Armstrong and Buzz Aldrin spent about 21 hours on "
    "the lunar surface, while Michael Collins orbited above in the command module. The mission "
    "returned 21.5 kg of lunar material to Earth.",

    "Can you help me plan a three-day trip to Lisbon? I like museums, long walks and seafood, and "
    "my budget is about 400 euros not counting the flights.",

    "SELECT customer_id, COUNT(*) AS orders, SUM(total) AS revenue FROM orders WHERE created_at >= "
    "'2024-01-01' GROUP BY customer_id ORDER BY revenue DESC LIMIT 10;",

    "Der Zug nach München fährt um 14:32 von Gleis 7 ab. Bitte beachten Sie, dass der Speisewagen "
    "heute geschlossen ist. El museo abre a las diez y cierra a las seis; la entrada es gratuita "
    "los domingos.",

    "To solve 3x + 7 = 22, subtract 7 from both sides to get 3x = 15, then divide by 3: x = 5. "
    "Check: 3 * 5 + 7 = 22. The area of a circle with radius 4 is pi * 16, about 50.27.",

    "Dear Ms. Patel, thank you for your quick reply. I would be happy to meet on Thursday afternoon "
    "to discuss the proposal. Please let me know whether 3 pm works for you. Best regards, Tom",

    "Plants turn sunlight, water and carbon dioxide into sugar and oxygen. The green pigment "
    "chlorophyll captures the light energy, and tiny pores on the leaves, called stomata, let "
    "gases in and out.",

    "1. Preheat the oven to 180 degrees. 2. Mix the flour, sugar and a pinch of salt. 3. Add the "
    "eggs one at a time. 4. Bake for 25 minutes, or until a toothpick comes out clean.",

    "Why do cats purr? Scientists are not completely sure, but purring seems to happen both when "
    "cats are content and when they are stressed or hurt, and the vibrations may even help bones "
    "heal.",
)


class _InputRecorder:
    """Stands in for one projection: sums the squares of each input column, then calls it."""

    def __init__(self, layer: Any, to_numpy: Callable[[Any], np.ndarray]) -> None:
        self.layer = layer
        self.to_numpy = to_numpy
        self.sum_squares: np.ndarray | None = None
        self.rows = 0

    def __call__(self, x: Any) -> Any:
        rows = np.asarray(self.to_numpy(x), dtype=np.float64)
        rows = rows.reshape(-1, rows.shape[-1])
        squares = np.einsum("ij,ij->j", rows, rows)
        self.sum_squares = squares if self.sum_squares is None else self.sum_squares + squares
        self.rows += rows.shape[0]
        return self.layer(x)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.layer, name)


def record_input_importance(executor: Calibratable, run: Callable[[], Any]) -> dict[str, np.ndarray]:
    """Call ``run`` (which drives ``executor``) with every projection watched; returns each
    projection's mean squared input per column, float32 [in], by checkpoint weight name.
    The executor's own layers are back in place afterwards, even if ``run`` fails."""
    watched = []
    try:
        for name, owner, attribute in executor.projections():
            recorder = _InputRecorder(getattr(owner, attribute), executor.to_numpy)
            watched.append((name, owner, attribute, recorder))
            setattr(owner, attribute, recorder)
        run()
    finally:
        for _, owner, attribute, recorder in reversed(watched):
            setattr(owner, attribute, recorder.layer)
    importance = {}
    for name, _, _, recorder in watched:
        if recorder.rows:
            mean_squares = (recorder.sum_squares / recorder.rows).astype(np.float32)
            if np.all(np.isfinite(mean_squares)):  # overflowing activations tell nothing
                importance[name] = mean_squares
            else:
                log.warning("calibration: %s saw non-finite inputs; quantizing it without importance", name)
    return importance


def calibration_token_lists(tokenizer: Any, longest: int) -> list[list[int]]:
    """The calibration texts as token ids, each cut to ``longest`` tokens (none if that is 0)."""
    return [tokens[:longest] for tokens in map(tokenizer.encode, CALIBRATION_TEXTS) if longest > 0 and tokens]


# --- the importance cache: measured once per model, backend and dtype -----------------------------

CACHE_FORMAT = 1  # bump when the statistics change meaning


def importance_key(checkpoint_files: Sequence[Path], model: Any, backend: str, dtype: str,
                   token_lists: list[list[int]]) -> str:
    """Names the measurement: which weight files (path, size, modification time) and model
    geometry, which backend and dtype computed it, and the exact tokens it read (so tokenizer,
    text and cut are all in it)."""
    digest = hashlib.sha256()
    for path in checkpoint_files:
        stat = path.stat()
        digest.update(f"{path.resolve()}:{stat.st_size}:{stat.st_mtime_ns}\n".encode())
    digest.update(json.dumps([CACHE_FORMAT, repr(model), backend, dtype, token_lists]).encode())
    return digest.hexdigest()[:32]


def load_importance(key: str) -> dict[str, np.ndarray] | None:
    """The cached measurement, or None when there is none (or it cannot be read)."""
    path = cache_dir("importance") / f"{key}.npz"
    try:
        with np.load(path) as stored:
            importance = {name: stored[name] for name in stored.files}
    except Exception:  # missing, truncated or not an npz at all: measure again
        return None
    valid = all(v.ndim == 1 and v.dtype == np.float32 and np.all(np.isfinite(v)) for v in importance.values())
    return importance if valid else None


def save_importance(key: str, importance: dict[str, np.ndarray]) -> None:
    """Write atomically (a concurrent reader sees no file or the whole one); a cache that cannot
    be written (read-only home) only costs the next load a new measurement."""
    directory = cache_dir("importance")
    try:
        directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=directory, suffix=".tmp", delete=False) as tmp:
            try:
                np.savez(tmp, **importance)
                tmp.flush()
                os.fsync(tmp.fileno())
                os.replace(tmp.name, directory / f"{key}.npz")
            except BaseException:
                os.unlink(tmp.name)
                raise
    except OSError as exc:
        log.warning("could not cache the int4 calibration in %s: %s", directory, exc)
