"""Where a benchmark writes: benchmarks/results/YYYY-MM-DD-WHAT/, today's date and what it
measured, with raw data beside its summary. Add the folder to the index (results/README.md:
machine, command, commit) when you keep it."""
from __future__ import annotations

import time
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def dated_folder(what: str) -> Path:
    """Today's folder for `what`, not yet made (a run that fails before measuring leaves none)."""
    return RESULTS / f"{time.strftime('%Y-%m-%d')}-{what}"


def result_folder(what: str) -> Path:
    folder = dated_folder(what)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
