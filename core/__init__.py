"""qwen-serve: a small, fast, readable inference server for Qwen3-family models on CPU."""
from .engine.llm import LLM, CompletionOutput
from .sampling.params import SamplingParams

__all__ = ["LLM", "CompletionOutput", "SamplingParams"]
__version__ = "0.1.0"
