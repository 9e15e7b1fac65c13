"""Tool calls and reasoning: a chat request's tools and tool_choice (a forced one as structured
output), the parsers of the model's text (tool calls per model family with vLLM's
--tool-call-parser names, reasoning `<think>...</think>`, a forced choice's JSON), whole or
streamed, and the chat output reshaped by them."""
