"""Tool-call parsers by model family, with vLLM's `--tool-call-parser` names: `hermes`
(`<tool_call>{json}</tool_call>`: Qwen2.5, Qwen3, Hermes), `llama3_json` (the message is
`{"name", "parameters"}` objects, `;`-separated), `mistral` (`[TOOL_CALLS][{...}]` or
`[TOOL_CALLS]name[ARGS]{...}`). A text whose calls do not parse is content, as vLLM does."""
from __future__ import annotations

import json
import re
import secrets
from dataclasses import dataclass, field

PARSERS = ("hermes", "llama3_json", "mistral")


@dataclass(slots=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object's text, as OpenAI sends it
    id: str = field(default_factory=lambda: "call_" + secrets.token_hex(12))

    def to_openai(self, index: int | None = None) -> dict:
        out = {"id": self.id, "type": "function", "function": {"name": self.name, "arguments": self.arguments}}
        return out if index is None else {"index": index, **out}


def _call(obj, args_key: str = "arguments") -> ToolCall | None:
    """A ToolCall from {"name", <args_key>} (arguments an object or its JSON text); None if not one."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            return None
    if not isinstance(args, dict):
        return None
    return ToolCall(obj["name"], json.dumps(args, ensure_ascii=False))


class ToolParser:
    """One family's format: `parse(text)` -> (content or None, calls); `start` is the text that
    opens the calls (a streamed text is held back while it may be forming); `at_start`: the
    calls can only open the message (after whitespace)."""

    name = ""
    start = ""
    at_start = False
    needs_special_tokens = False  # the opening marker is a special token (decode with it)

    def split(self, text: str) -> tuple[str, str] | None:
        """(content before the calls, the calls' text), or None when no call opens."""
        if self.at_start:
            body = text.lstrip()
            return ("", body) if body.startswith(self.start) else None
        i = text.find(self.start)
        return None if i < 0 else (text[:i], text[i:])

    def parse_calls(self, body: str) -> list[ToolCall] | None:
        raise NotImplementedError

    def parse(self, text: str) -> tuple[str | None, list[ToolCall]]:
        parts = self.split(text)
        calls = self.parse_calls(parts[1]) if parts else None
        if not calls:
            return text, []
        return parts[0] or None, calls


class HermesParser(ToolParser):
    name, start = "hermes", "<tool_call>"
    BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|$)", re.DOTALL)

    def parse_calls(self, body: str) -> list[ToolCall] | None:
        calls = []
        for m in self.BLOCK.finditer(body):
            try:
                call = _call(json.loads(m.group(1).strip()))
            except ValueError:
                return None
            if call is None:
                return None
            calls.append(call)
        return calls


class Llama3JsonParser(ToolParser):
    name, start, at_start = "llama3_json", "{", True

    def split(self, text: str) -> tuple[str, str] | None:
        return super().split(text.lstrip().removeprefix("<|python_tag|>"))

    def parse_calls(self, body: str) -> list[ToolCall] | None:
        decoder, calls, i = json.JSONDecoder(), [], 0
        while i < len(body):
            try:
                obj, i = decoder.raw_decode(body, i)
            except ValueError:
                return None
            call = _call(obj, "parameters")
            if call is None:
                return None
            calls.append(call)
            while i < len(body) and body[i] in " \t\r\n;":
                i += 1
        return calls


class MistralParser(ToolParser):
    name, start, needs_special_tokens = "mistral", "[TOOL_CALLS]", True
    NAMED = re.compile(r"\[TOOL_CALLS\]\s*([A-Za-z0-9_.-]+)\s*\[ARGS\]")

    def parse_calls(self, body: str) -> list[ToolCall] | None:
        if self.NAMED.match(body):  # v11+: [TOOL_CALLS]name[ARGS]{...}, repeated
            decoder, calls, i = json.JSONDecoder(), [], 0
            while (m := self.NAMED.match(body, i)) is not None:
                try:
                    args, i = decoder.raw_decode(body, m.end())
                except ValueError:
                    return None
                call = _call({"name": m.group(1), "arguments": args})
                if call is None:
                    return None
                calls.append(call)
                while i < len(body) and body[i].isspace():
                    i += 1
            return calls if i >= len(body) else None
        try:
            objs = json.JSONDecoder().raw_decode(body[len(self.start):].strip())[0]
        except ValueError:
            return None
        calls = [_call(o) for o in (objs if isinstance(objs, list) else [objs])]
        return None if not calls or None in calls else calls


_BY_NAME = {p.name: p for p in (HermesParser, Llama3JsonParser, MistralParser)}


def tool_parser(name: str) -> ToolParser:
    return _BY_NAME[name]()


def detect_parser(template: str | None) -> str | None:
    """The parser a chat template's tool format implies (vLLM needs TOOL_CALL_PARSER; we guess
    only from markers the template itself writes), or None."""
    template = template or ""
    if "<tool_call>" in template:
        return "hermes"
    if "[TOOL_CALLS]" in template:
        return "mistral"
    if "<|python_tag|>" in template or "Environment: ipython" in template:
        return "llama3_json"
    return None
