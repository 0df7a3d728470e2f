"""A checkpoint's own sampling recommendation (the fields of its generation_config.json), used
for the sampling fields a request leaves out, on every API, as vLLM does by default. Qwen3 asks
for temperature 0.6, top_p 0.95, top_k 20 in thinking mode: greedy decoding makes thinking
models repeat themselves, and agent clients (Claude Code, Codex, the anthropic SDK) send no
sampling fields at all. ``--generation-config none`` turns it off (the API's own defaults)."""
from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Collection, Mapping


@dataclass(frozen=True)
class SamplingDefaults:
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    repetition_penalty: float | None = None

    @classmethod
    def from_generation_config(cls, config: Mapping[str, Any]) -> SamplingDefaults:
        """The fields generation_config.json sets to usable values (others are left out:
        a checkpoint's odd value must not stop it loading)."""
        usable = {}
        for f in fields(cls):
            value = config.get(f.name)
            is_number = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if is_number and (f.name != "top_k" or float(value).is_integer()):
                usable[f.name] = int(value) if f.name == "top_k" else float(value)
        return cls(**usable)

    def as_dict(self) -> dict[str, float | int]:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}

    def for_missing(self, given: Collection[str]) -> dict[str, float | int]:
        """The defaults of the fields not in ``given`` (the fields a request set)."""
        return {name: value for name, value in self.as_dict().items() if name not in given}

    def served(self, generation_config: str) -> SamplingDefaults:
        """What a server started with ``--generation-config auto|none`` uses."""
        return self if generation_config == "auto" else SamplingDefaults()

    def describe(self) -> str:
        return ", ".join(f"{name} {value:g}" for name, value in self.as_dict().items()) or "none"
