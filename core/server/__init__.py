"""The HTTP server process: aiohttp app and routes, metrics, and the command line."""
