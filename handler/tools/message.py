"""One assistant message's text parsed into reasoning, content and tool calls, whole
(`parse`) or streamed (`feed` deltas, then `finish`), the two always agreeing: text that
may open a tool call is held back until the message ends."""
from __future__ import annotations

from handler.tools.reasoning import ReasoningStream, split_reasoning
from handler.tools.tool_calls import ToolCall, ToolParser, tool_parser


class ToolStream:
    """A streamed message's content with its tool calls held back: content before the calls
    comes at once (less what may be the opening marker), the calls when the message ends."""

    def __init__(self, parser: ToolParser):
        self.parser = parser
        self.state = "text"  # text -> plain | calls
        self.buf = ""

    def feed(self, delta: str) -> str:
        self.buf += delta
        if self.state == "plain":
            out, self.buf = self.buf, ""
            return out
        if self.state == "calls":
            return ""
        p = self.parser
        if p.at_start:
            body = self.buf.lstrip()
            starts = (p.start, "<|python_tag|>") if p.name == "llama3_json" else (p.start,)
            if any(body.startswith(s) for s in starts):
                self.state = "calls"
                return ""
            if not body or any(s.startswith(body) for s in starts):
                return ""
            self.state = "plain"
            return self.feed("")
        i = self.buf.find(p.start)
        if i >= 0:
            out, self.buf, self.state = self.buf[:i], self.buf[i:], "calls"
            return out
        keep = next((n for n in range(min(len(p.start) - 1, len(self.buf)), 0, -1)
                     if p.start.startswith(self.buf[-n:])), 0)
        out, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
        return out

    def finish(self) -> tuple[str, list[ToolCall]]:
        rest, self.buf = self.buf, ""
        if self.state != "calls":
            return rest, []
        calls = self.parser.parse_calls(self.parser.split(rest)[1]) if self.parser.split(rest) else None
        return ("", calls) if calls else (rest, [])


class MessageParser:
    """`reasoning`: a reasoning parser's name (handler.tools.reasoning) or None; `tools`: a
    tool-call parser's name (handler.tools.tool_calls) or None; `max_calls`: 1 when
    parallel_tool_calls is false (the first call only, as vLLM)."""

    def __init__(self, reasoning: str | None, tools: str | None, max_calls: int | None = None):
        self.reasoning_name, self.max_calls = reasoning, max_calls
        self.tools = tool_parser(tools) if tools else None
        self._r = ReasoningStream(reasoning) if reasoning else None
        self._t = ToolStream(self.tools) if self.tools else None

    def parse(self, text: str) -> tuple[str | None, str | None, list[ToolCall]]:
        """(reasoning, content, calls) of a whole message; content None when only calls came."""
        reasoning, content = split_reasoning(self.reasoning_name, text) if self.reasoning_name else (None, text)
        calls: list[ToolCall] = []
        if self.tools is not None:
            content, calls = self.tools.parse(content)
        return reasoning, content, calls[:self.max_calls]

    def feed(self, delta: str) -> tuple[str, str]:
        """(reasoning delta, content delta) of a streamed piece."""
        reasoning, content = self._r.feed(delta) if self._r else ("", delta)
        return reasoning, self._t.feed(content) if self._t else content

    def finish(self) -> tuple[str, str, list[ToolCall]]:
        """What was held back: (reasoning, content, calls)."""
        reasoning, content = self._r.finish() if self._r else ("", "")
        calls: list[ToolCall] = []
        if self._t:
            content = self._t.feed(content)
            rest, calls = self._t.finish()
            content += rest
        return reasoning, content, calls[:self.max_calls]
