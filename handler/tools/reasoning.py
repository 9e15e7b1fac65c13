"""Reasoning parsers with vLLM's `--reasoning-parser` names: `qwen3` (a message that opens
with `<think>` reasons until `</think>`; without it, all is content) and `deepseek_r1` (the
template opens `<think>` in the prompt, so the message reasons until `</think>`, all of it
when none comes)."""
from __future__ import annotations

PARSERS = ("qwen3", "deepseek_r1")
START, END = "<think>", "</think>"


def split_reasoning(name: str, text: str) -> tuple[str | None, str]:
    """(reasoning or None, content) of a whole message."""
    body = text.lstrip()
    opened = body.startswith(START)
    if opened:
        body = body[len(START):]
    elif name == "qwen3":
        return None, text
    else:
        body = text
    reasoning, end, content = body.partition(END)
    if not end:
        return body or None, ""
    return reasoning or None, content


def _held(text: str, marker: str) -> int:
    """Characters at the end of `text` that may be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ReasoningStream:
    """A streamed message split as `split_reasoning` splits it whole: `feed(delta)` and
    `finish()` give (reasoning delta, content delta); text that may be a marker waits."""

    def __init__(self, name: str):
        self.name = name
        self.state = "start"  # start -> reasoning -> content
        self.buf = ""

    def feed(self, delta: str) -> tuple[str, str]:
        self.buf += delta
        reasoning = content = ""
        if self.state == "start":
            body = self.buf.lstrip()
            if body.startswith(START):
                self.buf, self.state = body[len(START):], "reasoning"
            elif START.startswith(body):
                return "", ""  # whitespace, or a part of <think>: wait
            elif self.name == "deepseek_r1":
                self.state = "reasoning"
            else:
                self.state = "content"
        if self.state == "reasoning":
            before, end, after = self.buf.partition(END)
            if end:
                reasoning, self.buf, self.state = before, after, "content"
            else:
                keep = _held(self.buf, END)
                reasoning, self.buf = self.buf[:len(self.buf) - keep], self.buf[len(self.buf) - keep:]
                return reasoning, ""
        if self.state == "content":
            content, self.buf = self.buf, ""
        return reasoning, content

    def finish(self) -> tuple[str, str]:
        rest, self.buf = self.buf, ""
        if self.state == "start":  # only whitespace or a part of <think> came
            return ("", rest) if self.name == "qwen3" else (rest, "")
        return (rest, "") if self.state == "reasoning" else ("", rest)
