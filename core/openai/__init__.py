"""The OpenAI-compatible API: request schema and validation, response bodies, and one handler
per endpoint. The aiohttp router in qwen_serve.server only wires these to paths."""
