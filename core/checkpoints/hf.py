"""HF checkpoint directories: config.json, single or sharded safetensors, tokenizer.json, and the
chat template from tokenizer_config.json or chat_template.jinja."""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, Iterator

import tokenizers
from safetensors import safe_open

from ..errors import ModelLoadError
from ..models import architecture_named, model_config_from_hf
from ..models.config import ModelConfig
from ..sampling.defaults import SamplingDefaults
from .checkpoint import Checkpoint, read_json
from .tokenizer import Tokenizer


def load_hf_dir(path: Path) -> Checkpoint:
    config = model_config_from_hf(read_json(path / "config.json"), name=path.name)
    generation = path / "generation_config.json"
    if generation.exists():
        generation_config = read_json(generation)
        eos = generation_config.get("eos_token_id")
        config = config.with_eos(tuple(eos) if isinstance(eos, list) else (() if eos is None else (eos,)))
        config = dataclasses.replace(config, sampling_defaults=SamplingDefaults.from_generation_config(generation_config))
    pooling = sentence_transformers_pooling(path)
    if pooling is not None:
        config = dataclasses.replace(config, pooling=pooling)
    tokenizer = load_hf_tokenizer(path)
    files = _safetensors_files(path)
    as_read = architecture_named(config.architecture).tensors  # renamed, split or dropped as it reads them

    def tensors(framework: str, as_int4: Any, config: ModelConfig) -> Iterator[tuple[str, Any]]:  # no int4 blocks
        for file in files:
            with safe_open(file, framework=framework) as f:
                for name in f.keys():
                    yield from as_read(with_model_prefix(name), f.get_tensor(name), config)

    return Checkpoint(path=path, format="hf", config=config, tokenizer=tokenizer, _tensors=tensors)


BARE_DECODER_NAMES = ("embed_tokens.", "layers.", "norm.")  # a decoder saved without its head's wrapper


def with_model_prefix(name: str) -> str:
    """transformers' causal-LM name of a tensor: embedding models (Qwen3-Embedding) are saved from
    the bare decoder, whose tensors lack the "model." their causal LM gives them."""
    return "model." + name if name.startswith(BARE_DECODER_NAMES) else name


def sentence_transformers_pooling(path: Path) -> str | None:
    """How a sentence-transformers checkpoint pools ("last", "mean", "cls", ...), from the
    Pooling module modules.json lists; None when it is not one."""
    modules = path / "modules.json"
    if not modules.exists():
        return None
    entries = read_json(modules)
    folder = next((m.get("path", "") for m in entries if isinstance(m, dict)
                   and str(m.get("type", "")).endswith("Pooling")), None) if isinstance(entries, list) else None
    if folder is None or not (path / folder / "config.json").exists():
        return None
    settings = read_json(path / folder / "config.json")
    modes = [key.removeprefix("pooling_mode_") for key, on in settings.items() if key.startswith("pooling_mode_") and on]
    names = {"lasttoken": "last", "mean_tokens": "mean", "cls_token": "cls", "max_tokens": "max"}
    return "+".join(names.get(mode, mode) for mode in modes) or None


def load_hf_tokenizer(path: Path) -> Tokenizer:
    tokenizer_file = path / "tokenizer.json"
    if not tokenizer_file.exists():
        raise ModelLoadError(f"{path}: missing tokenizer.json")
    backend = tokenizers.Tokenizer.from_file(str(tokenizer_file))
    cfg = read_json(path / "tokenizer_config.json") if (path / "tokenizer_config.json").exists() else {}
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: use the default one
        template = next((t["template"] for t in template if t.get("name") == "default"), None)
    jinja_file = path / "chat_template.jinja"
    if template is None and jinja_file.exists():
        template = jinja_file.read_text(encoding="utf-8")
    return Tokenizer(backend, template, _token_text(cfg.get("bos_token")), _token_text(cfg.get("eos_token")))


def _token_text(token: Any) -> str | None:
    return token.get("content") if isinstance(token, dict) else token


def _safetensors_files(path: Path) -> list[Path]:
    index = path / "model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(read_json(index)["weight_map"].values()))
        missing = [s for s in shards if not (path / s).exists()]
        if missing:
            raise ModelLoadError(f"{path}: shards listed in the index are missing: {', '.join(missing)}")
        return [path / s for s in shards]
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ModelLoadError(f"{path}: no *.safetensors weights (pickle checkpoints are never loaded)")
    return files
