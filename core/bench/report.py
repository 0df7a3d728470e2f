"""The result document: one JSON file per run (machine, client settings, one record per
endpoint), merged files for a side-by-side, and the text table printed at the end."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Sequence

from .machine import machine_header

SCHEMA = "qwen-serve-bench/1"


def new_document(machine: dict[str, Any], settings: dict[str, Any], endpoints: Sequence[dict[str, Any]]) -> dict[str, Any]:
    return {"schema": SCHEMA, "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine,
            "settings": settings, "endpoints": list(endpoints)}


def write_json(document: dict[str, Any], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(document, indent=1, sort_keys=False) + "\n")
    tmp.replace(path)  # a reader never sees half a file
    return path


def read_json(path: Path) -> dict[str, Any]:
    document = json.loads(Path(path).read_text())
    if document.get("schema") != SCHEMA:
        raise ValueError(f"{path}: not a qwen-serve bench result (schema {document.get('schema')!r}, want {SCHEMA!r})")
    return document


def merge(documents: Sequence[dict[str, Any]], sources: Sequence[str]) -> dict[str, Any]:
    """One document with every endpoint of every input; each endpoint keeps its own run's machine
    and settings, so endpoints measured in different runs stay comparable only if those agree."""
    endpoints = []
    for document, source in zip(documents, sources):
        for endpoint in document["endpoints"]:
            endpoints.append({**endpoint, "source": source, "machine": document["machine"],
                              "settings": document["settings"]})
    names = [e["name"] for e in endpoints]
    duplicates = sorted({n for n in names if names.count(n) > 1})
    if duplicates:
        raise ValueError(f"endpoint names appear in more than one input: {', '.join(duplicates)}")
    return new_document(documents[0]["machine"], {"merged_from": list(sources)}, endpoints)


def _fmt(value: Any, scale: float = 1.0, digits: int = 1) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def format_table(document: dict[str, Any]) -> str:
    header = (f"{'endpoint':16s} {'prompt':>6s} {'output':>9s} {'conc':>4s} {'out tok/s':>10s} {'req/s':>7s} "
              f"{'in tok/s':>9s} {'TTFT p50/p95/p99 ms':>22s} {'ITL p50/p95/p99 ms':>21s} {'fail':>4s}")
    lines = [machine_header(document["machine"]), header]
    for endpoint in document["endpoints"]:
        for r in endpoint["results"]:
            ttft = "/".join(_fmt(r["ttft_s"][k], 1e3, 0) for k in ("p50", "p95", "p99"))
            itl = "/".join(_fmt(r["itl_s"][k], 1e3, 1) for k in ("p50", "p95", "p99"))
            lines.append(f"{endpoint['name'][:16]:16s} {r['prompt_tokens']:6d} {str(r['output_tokens']):>9s} "
                         f"{r['concurrency']:4d} {_fmt(r['output_tok_s']):>10s} {_fmt(r['requests_s'], digits=2):>7s} "
                         f"{_fmt(r['input_tok_s']):>9s} {ttft:>22s} {itl:>21s} {r['failed']:4d}")
    return "\n".join(lines)
