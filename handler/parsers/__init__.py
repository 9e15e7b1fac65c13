"""Parsers of a chat model's output text: tool calls (per model family, vLLM's
--tool-call-parser names) and reasoning (`<think>...</think>`), whole or streamed."""
