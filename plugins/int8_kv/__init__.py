"""The int8 KV cache plugin (qwen_serve.plugins.int8_kv)."""
