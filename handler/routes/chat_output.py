"""A chat completion's reasoning and tool calls parsed out of the model's text: the parsers
chosen once the model is known (`setup_chat`), and `ChatOutput`, the OpenAI formatter with
its messages and stream deltas reshaped (`reasoning_content`, `tool_calls`, finish_reason
"tool_calls"), whatever else the formatter puts in them kept. A forced tool_choice's calls
are read by handler.routes.forced_output instead."""
from __future__ import annotations

from typing import Any

from handler.job.chat_options import resolve_parsers
from handler.parsers.forced_calls import ForcedCallParser
from handler.parsers.message import MessageParser
from handler.parsers.tool_calls import tool_parser
from handler.routes.forced_output import ForcedToolOutput


def setup_chat(run) -> None:
    """Resolve the job's parsers against the model's chat template (raises invalid_input when
    tools cannot be served as asked); a parser whose marker is a special token gets it decoded."""
    spec = run.spec
    if spec.chat is None:
        return
    template = getattr(run.engine.tokenizer, "chat_template", None)
    resolve_parsers(spec.chat, run.settings, template if isinstance(template, str) else None, "openai_input.")
    parser = spec.chat.tool_parser
    if parser and tool_parser(parser).needs_special_tokens and "skip_special_tokens" not in spec.sampling:
        spec.sampling = {**spec.sampling, "skip_special_tokens": False}


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


class ChatOutput:
    """The formatter's objects with each choice's text split by a MessageParser (one per choice)."""

    def __init__(self, fmt, chat):
        self._fmt, self._chat = fmt, chat
        self._streams: dict[int, MessageParser] = {}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._fmt, name)

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
