"""A chat completion of a forced tool_choice: the OpenAI formatter with each choice's output
read as tool calls (handler.parsers.forced_calls), as vLLM answers one: `message.tool_calls`
and an empty content; streamed, each call's header (index, id, type, name) then its argument
fragments. finish_reason is "tool_calls" for "required" and the engine's own for a named
function ("stop": OpenAI's), "length" when the output was cut short."""
from __future__ import annotations

from typing import Any

from handler.parsers.forced_calls import ForcedCallStream, parse_forced


class ForcedToolOutput:
    """Wraps an OpenAIFormatter (or a wrapper of it); one ForcedCallStream per choice index."""

    def __init__(self, fmt, chat):
        self._fmt, self._chat = fmt, chat
        self._streams: dict[int, ForcedCallStream] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fmt, name)

    def _finish_reason(self, reason: str | None, calls: bool) -> str | None:
        if reason == "stop" and calls and self._chat.tool_name is None:
            return "tool_calls"
        return reason

    def response(self, *args, **kwargs) -> dict:
        out = self._fmt.response(*args, **kwargs)
        for choice in out.get("choices", []):
            message = choice["message"]
            calls = parse_forced(self._chat.tool_name, message.get("content") or "")
            message["content"] = ""
            message["tool_calls"] = [c.to_openai() for c in calls]
            choice["finish_reason"] = self._finish_reason(choice["finish_reason"], bool(calls))
        return out

    def chunk(self, text: str | None, finish_reason: str | None = None, **kwargs) -> dict:
        out = self._fmt.chunk(text, finish_reason, **kwargs)
        for choice in out.get("choices", []):
            stream = self._streams.setdefault(choice.get("index", 0), ForcedCallStream(self._chat.tool_name))
            stream.feed(text or "")
            delta = {k: v for k, v in choice.get("delta", {}).items() if k != "content"}
            if "role" in delta:
                delta["content"] = ""
            calls = stream.deltas()
            if calls:
                delta["tool_calls"] = calls
            choice["delta"] = delta
            choice["finish_reason"] = self._finish_reason(finish_reason, bool(stream.calls()))
        return out
