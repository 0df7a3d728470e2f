"""Checkpoints (HF directories, GGUF files), tokenizers and chat templates, the embedded
default model, and the start-up memory plan."""
