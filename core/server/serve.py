"""Start the HTTP server around a built engine."""
from __future__ import annotations

import sys
from typing import Any

from aiohttp import web

from ..engine.async_engine import AsyncEngine
from ..openai.chat_format import ChatFormat
from .app import ChatServer, ServerInfo


def serve(parts: Any, host: str, port: int, quant: str, served_name: str | None, model_arg: str | None,
          chat_format: ChatFormat | None = None) -> None:
    engine = AsyncEngine(parts.engine)
    name = served_name or parts.model_config.name
    aliases = tuple(a for a in (model_arg, parts.model_config.name) if a and a != name)
    info = ServerInfo(model=name, aliases=aliases, backend=parts.backend.name, quant=quant,
                      block_size=parts.engine_config.block_size, kv_blocks_total=parts.engine_config.kv_blocks,
                      max_batch=parts.engine_config.max_batch)
    app = ChatServer(engine, parts.tokenizer, info, chat_format).make_app()

    async def start_engine(_: web.Application) -> None:
        engine.start()

    async def stop_engine(_: web.Application) -> None:
        engine.shutdown()

    app.on_startup.append(start_engine)
    app.on_cleanup.append(stop_engine)
    url = f"http://{'[' + host + ']' if ':' in host else host}:{port}"
    web.run_app(app, host=host, port=port, handler_cancellation=True, access_log=None,
                print=lambda _: print(f"serving {name!r} on {url} (OpenAI API at {url}/v1)", file=sys.stderr, flush=True))
