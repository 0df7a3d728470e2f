"""`qwen-serve bench`: the HTTP benchmark client for any OpenAI-compatible endpoint."""
