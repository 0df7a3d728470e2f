"""A test backend plugin: the real torch backend (real checkpoint, forward passes, KV cache),
whose sampler writes a given script instead of sampling, so a reply's exact tokens are known.

Register it with ``QWEN_SERVE_PLUGIN_MODULES=scripted_backend`` (with tests/ on PYTHONPATH) and
choose it with ``--backend scripted``. ``QWEN_SERVE_SCRIPTS`` names a JSON file holding a list
of token-id lists; a request with seed k is answered with script k, token by token (a request
without a seed, as agent clients send, with script ``QWEN_SERVE_SCRIPT_DEFAULT`` if set). A
script should end with an end-of-sequence token; past its end the last token repeats.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, Mapping, Sequence

from qwen_serve.hookspecs import hookimpl
from qwen_serve.protocols import SampleResult

SCRIPTS_ENV = "QWEN_SERVE_SCRIPTS"
DEFAULT_ENV = "QWEN_SERVE_SCRIPT_DEFAULT"


def scripted_server_env(scripts_path: str) -> dict[str, str]:
    """The environment of a server that loads this plugin and answers from the scripts file."""
    here = os.path.dirname(os.path.abspath(__file__))
    return {"QWEN_SERVE_PLUGIN_MODULES": "scripted_backend", SCRIPTS_ENV: scripts_path,
            "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}


def write_scripts(scripts: Mapping[str, Sequence[int]], folder: Path) -> dict[str, Any]:
    """Writes the named scripts (token ids) to a file in folder: each name's seed (its script's
    number), and the file's path under "_path"."""
    path = folder / "scripts.json"
    path.write_text(json.dumps([list(s) for s in scripts.values()]))
    return {name: i for i, name in enumerate(scripts)} | {"_path": str(path)}


class ScriptCursor:
    """One request's place in its script (the sampler's per-request 'generator')."""

    def __init__(self, tokens: Sequence[int]) -> None:
        self.tokens = list(tokens)
        self.position = 0

    def next_token(self) -> int:
        token = self.tokens[min(self.position, len(self.tokens) - 1)]
        self.position += 1
        return token


class ScriptedSampler:
    def __init__(self, scripts: Sequence[Sequence[int]], default: int | None = None) -> None:
        self.scripts = [list(s) for s in scripts]
        self.default = default

    def make_generator(self, seed: int) -> ScriptCursor:
        if not 0 <= seed < len(self.scripts) and self.default is not None:
            seed = self.default  # no seed given: the engine drew a large random one
        if not 0 <= seed < len(self.scripts):
            raise ValueError(f"no script {seed}: {len(self.scripts)} scripts (the seed chooses one)")
        return ScriptCursor(self.scripts[seed])

    def sample(self, logits: Any, params: Sequence[Any], generators: Sequence[ScriptCursor],
               adjustment: Any = None) -> SampleResult:
        """The scripts' next tokens; a grammar's mask is not applied, but a script token the grammar
        refuses still fails its request (the grammar state checks every generated token)."""
        return SampleResult([g.next_token() for g in generators], [None] * len(generators))


def _load():
    from qwen_serve.backends.torch_cpu.backend import TorchBackend

    with open(os.environ[SCRIPTS_ENV], encoding="utf-8") as f:
        scripts = json.load(f)

    class ScriptedBackend(TorchBackend):
        name = "scripted"

        def create_sampler(self) -> ScriptedSampler:
            default = os.environ.get(DEFAULT_ENV)
            return ScriptedSampler(scripts, None if default is None else int(default))

    return ScriptedBackend()


@hookimpl
def register_backends(register):
    register("scripted", _load, requires=("torch",))
