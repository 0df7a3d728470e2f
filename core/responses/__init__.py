"""OpenAI's Responses API (POST /v1/responses, GET and DELETE /v1/responses/{id}) as a
translation layer over the chat machinery qwen_serve.openai serves Chat Completions with, and a
bounded in-memory store of responses for previous_response_id."""
