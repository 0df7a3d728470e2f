"""The page at / (chat) and /engine (the live engine view): static files from package data.

Both paths answer the same index.html; the script shows the tab the path names. The files are
read once and served from memory by name, so no request path reaches the file system. Every
answer carries a Content-Security-Policy that allows only this server's own scripts, styles and
connections (no inline script, no other origin), so even markdown that slipped past the
sanitiser could run nothing. The files themselves are open without an API key; everything they
fetch is not.
"""
from __future__ import annotations

from pathlib import Path

from aiohttp import web

PAGE_DIR = Path(__file__).parent / "page"
ASSET_PREFIX = "/page/"
CONTENT_TYPES = {".html": "text/html", ".js": "text/javascript", ".mjs": "text/javascript", ".css": "text/css",
                 ".svg": "image/svg+xml", ".txt": "text/plain", ".md": "text/markdown"}
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
       "base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
SECURITY_HEADERS = {"Content-Security-Policy": CSP, "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                    "Cache-Control": "no-cache"}


def wants_page(request: web.Request) -> bool:
    """A browser asks for HTML; API clients probing / (Claude Code's HEAD) get the JSON index."""
    return "text/html" in request.headers.get("Accept", "")


class Page:
    def __init__(self, directory: Path = PAGE_DIR) -> None:
        self.files = {path.relative_to(directory).as_posix(): path.read_bytes()
                      for path in sorted(directory.rglob("*")) if path.suffix in CONTENT_TYPES}

    def response(self, name: str) -> web.Response:
        body = self.files.get(name)
        if body is None:
            raise web.HTTPNotFound()
        content_type = CONTENT_TYPES[Path(name).suffix]
        return web.Response(body=body, content_type=content_type, charset="utf-8", headers=SECURITY_HEADERS)

    async def index(self, request: web.Request) -> web.Response:
        return self.response("index.html")

    async def asset(self, request: web.Request) -> web.Response:
        return self.response(request.match_info["name"])

    def add_routes(self, app: web.Application) -> None:
        """/engine and the assets; / is the server's own route, which calls index for browsers."""
        app.router.add_get("/engine", self.index)
        app.router.add_get(ASSET_PREFIX + "{name:.+}", self.asset)
