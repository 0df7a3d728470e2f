"""Anthropic's Messages API (POST /v1/messages, /v1/messages/count_tokens) as a translation
layer over the chat machinery qwen_serve.openai serves Chat Completions with."""
