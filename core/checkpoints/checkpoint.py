"""A model on disk: its geometry, tokenizer and weights under transformers' tensor names.

Two formats: HF checkpoint directories (config.json + safetensors) and GGUF files. Weights are
yielded lazily so a backend can convert (or quantize) one tensor at a time; safetensors are
opened in the backend's own framework, GGUF tensors arrive as float32 numpy arrays (or, asked
for, Q4_0 ones as int4).
Pickle checkpoints are never loaded.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from ..errors import ModelLoadError
from ..models.config import ModelConfig
from .tokenizer import Tokenizer


@dataclass
class Checkpoint:
    path: Path
    format: str  # "hf" | "gguf"
    config: ModelConfig
    tokenizer: Tokenizer
    # (framework, as_int4, the config as it stands now) -> the tensors, read as that config needs
    _tensors: Callable[[str, Callable[[str], bool] | None, ModelConfig], Iterator[tuple[str, Any]]]
    int4_blocks: bool = False  # every projection is stored in 4-bit blocks that tensors() converts to int4

    def tensors(self, framework: str = "numpy",
                as_int4: Callable[[str], bool] | None = None) -> Iterator[tuple[str, Any]]:
        """(transformers name, array) pairs; framework is a safetensors framework name. Where
        as_int4(name) is true and the file holds that tensor in 4-bit blocks that convert
        without a float copy (GGUF Q4_0), it comes as a quant.int4.Int4Weight instead. What is
        read follows self.config as it is when called (a draft head only when it is built)."""
        return self._tensors(framework, as_int4, self.config)

    def files(self) -> list[Path]:
        """The files holding the weights."""
        return [self.path] if self.path.is_file() else sorted(self.path.glob("*.safetensors"))


def load_checkpoint(path: str | os.PathLike) -> Checkpoint:
    from .gguf import load_gguf
    from .hf import load_hf_dir

    p = Path(path).expanduser()
    if p.is_file() and p.suffix == ".gguf":
        return load_gguf(p)
    if p.is_dir():
        return load_hf_dir(p)
    if p.exists():
        raise ModelLoadError(f"{p}: not a checkpoint directory or .gguf file (pickle checkpoints are never loaded)")
    if _looks_like_hub_id(str(path)):
        return load_hf_dir(_download_from_hub(str(path)))
    raise ModelLoadError(f"{p}: no such file or directory")


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return len(parts) == 2 and all(parts) and not name.startswith((".", "/", "~"))


def _download_from_hub(repo_id: str) -> Path:
    try:
        from huggingface_hub import snapshot_download
    except ImportError as exc:
        raise ModelLoadError(f"{repo_id}: not a local path, and huggingface_hub is not installed to download it") from exc
    try:
        return Path(snapshot_download(repo_id, allow_patterns=["*.json", "*.safetensors", "*.jinja", "*.txt"]))
    except Exception as exc:  # offline, unknown repo, auth: one line for the user
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise ModelLoadError(
            f"{repo_id}: not a local path, and downloading it from the Hugging Face hub failed "
            f"({type(exc).__name__}{': ' + reason if reason else ''})"
        ) from exc


def read_json(path: Path) -> dict[str, Any]:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError as exc:
        raise ModelLoadError(f"{path.parent}: missing {path.name}") from exc
    except json.JSONDecodeError as exc:
        raise ModelLoadError(f"{path}: invalid JSON ({exc})") from exc
