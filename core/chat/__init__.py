"""Chat below every API surface and the offline LLM: messages and tools validated, rendered by
the model's template, and replies parsed into reasoning, content and tool calls."""
