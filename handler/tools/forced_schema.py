"""A forced tool_choice as structured output, built the way vLLM builds it: "required" is a
JSON array (at least one item; at most one when parallel_tool_calls is false) of
{"name": <a tool's name>, "parameters": <that tool's parameters schema>}, any of the tools;
a named function is its parameters schema, the output being the call's arguments
(handler.tools.forced_calls reads both back as tool calls)."""
from __future__ import annotations

import copy

from handler.errors import invalid
from handler.job.structured import Structured

# a tool without parameters takes none: its arguments are {}
NO_PARAMETERS = {"type": "object", "properties": {}, "additionalProperties": False}
DEFS = ("$defs", "definitions")  # where a schema's "#/$defs/..." references point: the root


def _item(name: str, params: dict) -> dict:
    return {"type": "object", "properties": {"name": {"type": "string", "enum": [name]}, "parameters": params},
            "required": ["name", "parameters"], "additionalProperties": False}


def forced_structured(opts, p: str, flat: bool = False) -> Structured | None:
    """The structured output of a forced tool_choice (None when it is not forced); `flat`: the
    Responses API's tools ({type, name, parameters}). A schema the engine cannot compile is
    refused naming the tool's parameters (named) or the tools (required)."""
    if not opts.forced:
        return None
    fn_where = "" if flat else ".function"
    if opts.tool_name is not None:
        i, fn = next((i, t["function"]) for i, t in enumerate(opts.tools) if t["function"]["name"] == opts.tool_name)
        return Structured({"json": fn.get("parameters") or NO_PARAMETERS}, "tool_choice",
                          f"tools[{i}]{fn_where}.parameters")
    items, defs = [], {}
    for i, tool in enumerate(opts.tools):
        params = copy.copy(tool["function"].get("parameters") or NO_PARAMETERS)
        for key in DEFS:  # lifted to the root, where their references point
            if not isinstance(params.get(key), dict):
                continue
            for name, schema in params.pop(key).items():
                if defs.setdefault((key, name), schema) != schema:
                    raise invalid(f"{p}tools[{i}]{fn_where}.parameters.{key}",
                                  f"{name!r:.80} differs from another tool's {key} of that name; "
                                  'tool_choice "required" needs them to agree')
        items.append(_item(tool["function"]["name"], params))
    schema: dict = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
    if not opts.parallel_tool_calls:
        schema["maxItems"] = 1
    for (key, name), value in defs.items():
        schema.setdefault(key, {})[name] = value
    return Structured({"json": schema}, "tool_choice", "tools")
