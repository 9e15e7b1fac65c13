"""Structured output as an OpenAI request asks for it, into the engine's `structured_outputs`
value: `response_format` (and the Responses API's `text.format`), vLLM's `structured_outputs`
object and its older top-level `guided_*` fields. One source per request (a forced
tool_choice is one too: handler.tools.forced_schema); the engine's refusals of the value
name the field it came from."""
from __future__ import annotations

import re
from typing import Any

from handler.errors import invalid
from handler.job.structured import Structured, check_backend, spec_object

GUIDED = {"guided_json": "json", "guided_regex": "regex", "guided_choice": "choice", "guided_grammar": "grammar"}
OPTIONS = ("guided_whitespace_pattern", "guided_decoding_backend")
OPENAI_KEYS = frozenset({"response_format", "structured_outputs", *GUIDED, *OPTIONS})
SCHEMA_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")  # OpenAI's rule for a json_schema's name
FORMATS = '{"type": "text"}, {"type": "json_object"} or {"type": "json_schema", ...}'


def _only(value: dict, keys: set, where: str) -> None:
    unknown = [k for k in value if k not in keys]
    if unknown:
        raise invalid(f"{where}.{str(unknown[0])[:100]}", "unknown field; expected " + ", ".join(sorted(keys)))


def json_schema(value: Any, where: str, extra: frozenset = frozenset()) -> dict:
    """OpenAI's json_schema object {name, schema, strict, description} (`extra`: other keys its
    container holds, the Responses API's flat form) as the engine's fields."""
    if not isinstance(value, dict):
        raise invalid(where, "must be an object {name, schema, strict, description}")
    _only(value, {"name", "schema", "strict", "description"} | extra, where)
    name = value.get("name")
    if not isinstance(name, str) or not SCHEMA_NAME.match(name):
        raise invalid(where + ".name", "is required: 1-64 letters, digits, _ and -")
    schema = value.get("schema")
    if not isinstance(schema, dict):
        raise invalid(where + ".schema", "is required: a JSON schema (an object)")
    for key, kind in (("strict", bool), ("description", str)):
        if value.get(key) is not None and not isinstance(value[key], kind):
            raise invalid(f"{where}.{key}", "must be true or false" if kind is bool else "must be a string")
    return {"json": schema}  # strict or not, the output follows the schema (as in vLLM)


def response_format(value: Any, where: str, flat: bool = False) -> dict | None:
    """OpenAI's response_format (`flat`: the Responses API's text.format, its json_schema's
    fields beside `type`) as the engine's fields; None for text."""
    if not isinstance(value, dict):
        raise invalid(where, "must be " + FORMATS)
    kind = value.get("type")
    if kind in ("text", "json_object"):
        _only(value, {"type"}, where)
        return {"json_object": True} if kind == "json_object" else None
    if kind == "json_schema":
        if flat:
            return json_schema(value, where, frozenset({"type"}))
        _only(value, {"type", "json_schema"}, where)
        return json_schema(value.get("json_schema"), where + ".json_schema")
    raise invalid(where + ".type", "must be " + FORMATS + (" (vLLM's structural_tag is not supported)"
                                                           if kind == "structural_tag" else ""))


def one_source(sources: list[Structured], p: str) -> Structured | None:
    """The request's one structured output; a second is refused, naming it."""
    if len(sources) > 1:
        first, second = sources[0].sent, sources[1].sent
        raise invalid(p + second, f"only one structured output per request ({first} is one already)")
    return sources[0] if sources else None


def openai_structured(oi: dict, p: str, forced: Structured | None = None) -> Structured | None:
    """The structured output of an OpenAI chat or completions request (`forced`: the one of a
    forced tool_choice), from whichever field gave it, in the order the client sent them."""
    sources = []
    for key, value in oi.items():
        if value is None:
            continue
        if key == "response_format":
            fields = response_format(value, p + key)
            if fields is not None:
                sources.append(Structured(fields, key, key))
        elif key == "structured_outputs":
            sources.append(Structured(spec_object(value, p + key), key, key))
        elif key in GUIDED:
            sources.append(Structured({GUIDED[key]: value}, key, key))
        elif key == "tool_choice" and forced is not None:
            sources.append(forced)
    found = one_source(sources, p)
    check_backend(oi.get("guided_decoding_backend"), p + "guided_decoding_backend")
    pattern = oi.get("guided_whitespace_pattern")
    if pattern is not None:
        where = p + "guided_whitespace_pattern"
        if not isinstance(pattern, str):
            raise invalid(where, "must be a string (a regex)")
        if found is None:
            raise invalid(where, "applies only with a structured output (guided_json, response_format, ...)")
        if found.value.get("whitespace_pattern") is not None:
            raise invalid(where, f"{found.sent} sets whitespace_pattern already")
        found.value["whitespace_pattern"] = pattern
    return found
