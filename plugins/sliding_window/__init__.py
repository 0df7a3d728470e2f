"""The sliding-window KV cache plugin (qwen_serve.plugins.sliding_window)."""
