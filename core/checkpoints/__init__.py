"""Checkpoints: HF directories and GGUF files read into one ModelConfig + weights, their
tokenizers, and the embedded default model."""
