"""The tool calls of a forced tool_choice's output (its JSON shaped by handler.tools.forced_schema):
a named function's output is the call's arguments; "required"'s is an array of
{"name", "parameters"}. Read as it streams, character by character: a call's deltas are its
header (index, id, type, name) once the name is complete, then fragments of its arguments,
and the fragments join to exactly the arguments the whole output gives. Whitespace between
JSON tokens is dropped from the arguments (it means nothing; the grammar allows it)."""
from __future__ import annotations

import json

from handler.tools.tool_calls import ToolCall

WS = " \t\n\r"


class _Call:
    __slots__ = ("call", "named", "sent")

    def __init__(self, name: str | None):
        self.call = ToolCall(name or "", "")
        self.named = name is not None  # the name is complete
        self.sent = -1  # characters of arguments streamed; -1: the header not yet


class ForcedCallStream:
    """One choice's output; `name`: the named function (None: tool_choice "required")."""

    def __init__(self, name: str | None = None):
        self.named = name
        self._calls = [_Call(name)] if name is not None else []
        self.in_str = self.esc = False
        self.depth = 0  # of brackets outside strings: 1 in the array, 2 in an item
        # "required": where the scan is in the current item: "key" (a key or the item's end
        # next), "key_text", "colon", "value", "in_value" (of kind value_kind), "after"
        self.state = "key"
        self.key = ""  # the key being read, then the one whose value is being read
        self.value_kind = ""  # "compound" | "string" | "scalar"
        self.name_raw = ""  # the JSON text of the name being read

    def feed(self, text: str) -> None:
        for ch in text:
            inside = self.in_str  # ch is within a string (its closing quote included)
            self._track_string(ch)
            if self.named is not None:
                if inside or ch not in WS:
                    self._calls[0].call.arguments += ch
            elif self.state != "in_value" or self._value_char(ch, inside):
                self._item_char(ch, inside)

    def _track_string(self, ch: str) -> None:
        if self.in_str:
            if self.esc:
                self.esc = False
            elif ch == "\\":
                self.esc = True
            elif ch == '"':
                self.in_str = False
        elif ch == '"':
            self.in_str = True

    def _value_char(self, ch: str, inside: bool) -> bool:
        """A character of the value being read; True when it ended the value before this
        character, which is then the item's (a scalar's ',' or '}')."""
        kind = self.value_kind
        if kind == "scalar" and (ch in WS or ch in ",}]"):
            self._end_value()
            return True
        if inside or ch not in WS:
            self._take(ch)
        if kind == "string" and inside and not self.in_str:
            self._end_value()
        elif kind == "compound" and not inside and ch in "[]{}":
            self.depth += 1 if ch in "[{" else -1
            if self.depth == 2:
                self._end_value()
        return False

    def _item_char(self, ch: str, inside: bool) -> None:
        """A character outside any value: the array's and its items' structure, and their keys."""
        if self.state == "key_text":
            self.key += ch
            if not self.in_str:
                self.key, self.state = _string(self.key), "colon"
            return
        if inside or ch in WS:
            return
        if self.depth == 2 and self.state == "value":
            self.value_kind = "compound" if ch in "[{" else "string" if ch == '"' else "scalar"
            self.state = "in_value"
            self._take(ch)
            if ch in "[{":
                self.depth += 1
        elif ch in "[{":
            self.depth += 1
            if self.depth == 2:  # an item opens
                self._calls.append(_Call(None))
                self.state = "key"
        elif ch in "]}":
            self.depth -= 1
        elif self.depth == 2:
            if ch == '"' and self.state == "key":
                self.key, self.state = ch, "key_text"
            elif ch == ":" and self.state == "colon":
                self.state = "value"
            elif ch == "," and self.state == "after":
                self.state = "key"

    def _take(self, ch: str) -> None:
        if self.key == "parameters":
            self._calls[-1].call.arguments += ch
        elif self.key == "name":
            self.name_raw += ch

    def _end_value(self) -> None:
        if self.key == "name":
            name, call = _string(self.name_raw), self._calls[-1]
            if isinstance(name, str) and name:
                call.call.name, call.named = name, True
            self.name_raw = ""
        self.state = "after"

    def deltas(self) -> list[dict]:
        """OpenAI's tool-call deltas of what came since the last call: a call's header (with the
        arguments so far) once its name is complete, then the new arguments."""
        out = []
        for index, c in enumerate(self._calls):
            if not c.named:
                continue
            args = c.call.arguments
            if c.sent < 0:
                out.append({"index": index, "id": c.call.id, "type": "function",
                            "function": {"name": c.call.name, "arguments": args}})
            elif len(args) > c.sent:
                out.append({"index": index, "function": {"arguments": args[c.sent:]}})
            c.sent = len(args)
        return out

    def calls(self) -> list[ToolCall]:
        """The calls so far whose name is complete (their arguments as they stand)."""
        return [c.call for c in self._calls if c.named]


def _string(raw: str):
    try:
        return json.loads(raw)
    except ValueError:
        return None


def parse_forced(name: str | None, text: str) -> list[ToolCall]:
    """The calls of a whole output (the same as its stream gives)."""
    stream = ForcedCallStream(name)
    stream.feed(text)
    return stream.calls()


class ForcedCallParser:
    """handler.tools.message.MessageParser's interface for a forced tool_choice's output:
    no reasoning and no content, only calls (Responses builds its items from these)."""

    def __init__(self, name: str | None):
        self.name = name
        self._stream = ForcedCallStream(name)

    def parse(self, text: str) -> tuple[None, None, list[ToolCall]]:
        return None, None, parse_forced(self.name, text)

    def feed(self, delta: str) -> tuple[str, str]:
        self._stream.feed(delta)
        return "", ""

    def finish(self) -> tuple[str, str, list[ToolCall]]:
        return "", "", self._stream.calls()
