"""A chat completion's output with its reasoning and tool calls parsed out of the model's text:
the OpenAI formatter wrapped, its messages and stream deltas reshaped, whatever else the
formatter puts in them kept. `ChatOutput` splits `reasoning_content` and `tool_calls` from the
text (finish_reason "tool_calls" when calls came); `ForcedToolOutput` reads a forced
tool_choice's output as calls, as vLLM answers one: `message.tool_calls` and an empty
content; streamed, each call's header (index, id, type, name) then its argument fragments.
A forced choice's finish_reason is "tool_calls" for "required" and the engine's own for a named
function ("stop": OpenAI's), "length" when the output was cut short."""
from __future__ import annotations

from typing import Any

from handler.tools.forced_calls import ForcedCallParser, ForcedCallStream, parse_forced
from handler.tools.message import MessageParser


def message_parser(chat) -> MessageParser | ForcedCallParser:
    if chat.forced:
        return ForcedCallParser(chat.tool_name)
    return MessageParser(chat.reasoning_parser, chat.tool_parser, chat.max_calls)


def chat_output(fmt, spec):
    """`fmt` itself, or wrapped: in ForcedToolOutput for a forced tool_choice, in ChatOutput when
    the job's chat output has something to parse."""
    chat = spec.chat
    if not getattr(fmt, "chat", False) or chat is None:
        return fmt
    if chat.forced:
        return ForcedToolOutput(fmt, chat)
    return ChatOutput(fmt, chat) if chat.tool_parser or chat.reasoning_parser else fmt


class _Reshaped:
    """An OpenAIFormatter (or a wrapper of it) whose objects a subclass reshapes, with one
    stream reader per choice index; every other attribute is the formatter's."""

    def __init__(self, fmt, chat):
        self._fmt, self._chat = fmt, chat
        self._streams: dict[int, Any] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fmt, name)


class ChatOutput(_Reshaped):
    """The formatter's objects with each choice's text split by a MessageParser (one per choice)."""

    def response(self, *args, **kwargs) -> dict:
        out = self._fmt.response(*args, **kwargs)
        for choice in out.get("choices", []):
            message = choice["message"]
            reasoning, content, calls = message_parser(self._chat).parse(message.get("content") or "")
            message["content"] = content
            if reasoning is not None:
                message["reasoning_content"] = reasoning
            if calls:
                message["tool_calls"] = [c.to_openai() for c in calls]
                choice["finish_reason"] = "tool_calls"
        return out

    def chunk(self, text: str | None, finish_reason: str | None = None, **kwargs) -> dict:
        out = self._fmt.chunk(text, finish_reason, **kwargs)
        for choice in out.get("choices", []):
            self._reshape(choice, text or "", finish_reason is not None)
        return out

    def _reshape(self, choice: dict, text: str, finishing: bool) -> None:
        parser = self._streams.setdefault(choice.get("index", 0), message_parser(self._chat))
        reasoning, content = parser.feed(text)
        calls = []
        if finishing:
            more_reasoning, more_content, calls = parser.finish()
            reasoning, content = reasoning + more_reasoning, content + more_content
        delta = {k: v for k, v in choice.get("delta", {}).items() if k != "content"}
        if content or "role" in delta:
            delta["content"] = content
        if reasoning:
            delta["reasoning_content"] = reasoning
        if calls:
            delta["tool_calls"] = [c.to_openai(index=i) for i, c in enumerate(calls)]
            choice["finish_reason"] = "tool_calls"
        choice["delta"] = delta


class ForcedToolOutput(_Reshaped):
    """The formatter's objects with each choice's output read as a forced tool_choice's calls
    (handler.tools.forced_calls), one ForcedCallStream per choice index."""

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
