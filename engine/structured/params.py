"""vLLM's StructuredOutputsParams: what a request's output must match. Exactly one of
json (a JSON schema, as an object or its text), json_object (any JSON object), regex,
choice (one of these strings) or grammar (Lark, or llama.cpp's GBNF) is set. The
options shape JSON output: disable_any_whitespace (compact separators only),
disable_additional_properties (objects without additionalProperties get false) and
whitespace_pattern (the regex whitespace between JSON tokens must match)."""
from __future__ import annotations

import json
from dataclasses import dataclass, fields
from typing import Any

from engine.errors import InvalidInputError

FIELD = "structured_outputs"
KINDS = ("json", "json_object", "regex", "choice", "grammar")
OPTIONS = ("disable_any_whitespace", "disable_additional_properties", "whitespace_pattern")
MAX_SPEC_CHARS = 1 << 20  # a schema, grammar or regex longer than 1 MiB of text is refused
MAX_CHOICES = 4096


def _bad(message: str) -> InvalidInputError:
    return InvalidInputError(f"{FIELD}: {message}", field=FIELD)


@dataclass(frozen=True, slots=True)
class StructuredOutputsParams:
    json: str | dict | None = None
    json_object: bool | None = None
    regex: str | None = None
    choice: list[str] | None = None
    grammar: str | None = None
    disable_any_whitespace: bool = False
    disable_additional_properties: bool = False
    whitespace_pattern: str | None = None

    def __post_init__(self):
        self.validate()

    @classmethod
    def from_value(cls, value: Any) -> "StructuredOutputsParams":
        """From a request's value: these params, or a mapping of their fields."""
        if isinstance(value, cls):
            return value
        if not isinstance(value, dict):
            raise _bad("must be an object with one of " + ", ".join(KINDS))
        names = {f.name for f in fields(cls)}
        unknown = [k for k in value if k not in names]
        if unknown:
            raise _bad(f"{unknown[0]!r:.60} is not supported; the fields are " + ", ".join((*KINDS, *OPTIONS)))
        return cls(**{k: v for k, v in value.items() if v is not None})

    def validate(self) -> None:
        set_ = [k for k in KINDS if getattr(self, k) not in (None, False)]
        if len(set_) != 1:
            raise _bad("set exactly one of " + ", ".join(KINDS) + (f" (got {', '.join(set_)})" if set_ else ""))
        kind = set_[0]
        value = getattr(self, kind)
        if kind == "json":
            if isinstance(value, str):
                try:
                    parsed = json.loads(value)
                except ValueError as exc:
                    raise _bad(f"json is not valid JSON ({exc})") from None
            else:
                parsed = value
            if not isinstance(parsed, (dict, bool)):
                raise _bad("json must be a JSON schema (an object)")
        elif kind == "json_object":
            if value is not True:
                raise _bad("json_object must be true")
        elif kind == "choice":
            if not (isinstance(value, list) and value and len(value) <= MAX_CHOICES
                    and all(isinstance(c, str) and c for c in value)):
                raise _bad(f"choice must be a list of 1 to {MAX_CHOICES} non-empty strings")
        elif not (isinstance(value, str) and value.strip()):
            raise _bad(f"{kind} must be a non-empty string")
        if len(self.spec_text) > MAX_SPEC_CHARS:
            raise _bad(f"{kind} is longer than {MAX_SPEC_CHARS} characters")
        for name in ("disable_any_whitespace", "disable_additional_properties"):
            if not isinstance(getattr(self, name), bool):
                raise _bad(f"{name} must be true or false")
        if self.whitespace_pattern is not None and not isinstance(self.whitespace_pattern, str):
            raise _bad("whitespace_pattern must be a string (a regex)")

    @property
    def kind(self) -> str:
        return next(k for k in KINDS if getattr(self, k) not in (None, False))

    @property
    def spec_text(self) -> str:
        """The kind's value as text (a schema serialised with sorted keys)."""
        value = getattr(self, self.kind)
        if isinstance(value, str):
            return value
        return json.dumps(value, sort_keys=True, ensure_ascii=False)

    def key(self) -> tuple:
        """The compiled grammar's cache key."""
        return (self.kind, self.spec_text, self.disable_any_whitespace, self.disable_additional_properties,
                self.whitespace_pattern)
