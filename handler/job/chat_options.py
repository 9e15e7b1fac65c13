"""A chat request's tool and template fields (`tools`, `tool_choice`, `parallel_tool_calls`,
`chat_template_kwargs`) as `ChatOptions`, checked at parse time; the parsers the model's
output goes through are chosen once the model is known (`resolve_parsers`)."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from handler.errors import invalid

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
CHAT_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")
NEEDS_GRAMMAR = ("needs constrained decoding (structured output), which this worker does not have yet: "
                 'send "auto" (the model may call a tool, parsed from its text) or "none"')


@dataclass(slots=True)
class ChatOptions:
    tools: list[dict] | None = None  # OpenAI chat form: [{type: function, function: {name, ...}}]
    tool_choice: str | None = None  # "none" | "auto"; None: not given (auto when a parser is known)
    parallel_tool_calls: bool = True
    template_kwargs: dict | None = None  # chat_template_kwargs
    tool_parser: str | None = None  # set by resolve_parsers (handler.parsers.tool_calls)
    reasoning_parser: str | None = None  # set by resolve_parsers (handler.parsers.reasoning)
    request: dict | None = None  # a Responses request's fields its Response echoes

    def prompt_fields(self) -> dict:
        """What the engine's input processor takes beside the messages."""
        out: dict[str, Any] = {}
        if self.tools:  # rendered with tool_choice "none" too, as vLLM does
            out["tools"] = self.tools
        if self.template_kwargs:
            out["chat_template_kwargs"] = self.template_kwargs
        return out

    @property
    def max_calls(self) -> int | None:
        return None if self.parallel_tool_calls else 1


def parse_tool(tool: Any, where: str, flat: bool = False) -> dict:
    """One tool definition in the chat form; `flat`: the Responses API's {type, name, ...}."""
    if not isinstance(tool, dict) or tool.get("type") != "function":
        raise invalid(where, 'only {"type": "function", ...} tools are supported')
    fn = tool if flat else tool.get("function")
    if not isinstance(fn, dict):
        raise invalid(where + ".function", "must be an object with name, description, parameters")
    name = fn.get("name")
    if not isinstance(name, str) or not TOOL_NAME.match(name):
        raise invalid(where + (".name" if flat else ".function.name"), "must be 1-64 letters, digits, _ . : -")
    out = {"name": name}
    for key, kind in (("description", str), ("parameters", dict), ("strict", bool)):
        value = fn.get(key)
        if value is not None and not isinstance(value, kind):
            raise invalid(f"{where}{'' if flat else '.function'}.{key}", f"must be a {kind.__name__}")
        if value is not None and key != "strict":
            out[key] = value
    if fn.get("strict"):
        raise invalid(f"{where}{'' if flat else '.function'}.strict", "strict tools " + NEEDS_GRAMMAR)
    return {"type": "function", "function": out}


def parse_tool_choice(value: Any, where: str) -> str | None:
    if value is None or value in ("none", "auto"):
        return value
    if value == "required" or isinstance(value, dict):
        raise invalid(where, f"{value!r} " + NEEDS_GRAMMAR if value == "required" else "a named function " + NEEDS_GRAMMAR)
    raise invalid(where, 'must be "none", "auto", "required" or {"type": "function", ...}')


def parse_chat_options(oi: dict, p: str, flat_tools: bool = False) -> ChatOptions:
    """The ChatOptions of an OpenAI request (`p`: the field prefix, e.g. "openai_input.")."""
    opts = ChatOptions()
    tools = oi.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid(p + "tools", "must be a list of tool definitions")
        opts.tools = [parse_tool(t, f"{p}tools[{i}]", flat_tools) for i, t in enumerate(tools)] or None
    opts.tool_choice = parse_tool_choice(oi.get("tool_choice"), p + "tool_choice")
    parallel = oi.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid(p + "parallel_tool_calls", "must be true or false")
    opts.parallel_tool_calls = parallel is not False
    kwargs = oi.get("chat_template_kwargs")
    if kwargs is not None and (not isinstance(kwargs, dict) or not all(isinstance(k, str) for k in kwargs)):
        raise invalid(p + "chat_template_kwargs", "must be an object")
    opts.template_kwargs = kwargs or None
    return opts


def resolve_parsers(opts: ChatOptions, settings: Any, template: str | None, field: str) -> None:
    """Choose the output parsers now that the model's chat template is known: reasoning by
    REASONING_PARSER; tool calls (when tools are given and tool_choice is not "none") by
    TOOL_CALL_PARSER, else from the template's own markers. Raises invalid_input naming
    `field` + tools / tool_choice when the request cannot be served as asked."""
    from handler.parsers import reasoning, tool_calls

    name = (getattr(settings, "reasoning_parser", None) or "").lower()
    opts.reasoning_parser = name if name in reasoning.PARSERS else None
    if not opts.tools or opts.tool_choice == "none":
        return
    if "tools" not in (template or ""):
        raise invalid(field + "tools", "this model's chat template does not render tools (set CUSTOM_CHAT_TEMPLATE "
                      "to one that does)")
    configured = (getattr(settings, "tool_call_parser", None) or "").lower()
    parser = configured or tool_calls.detect_parser(template)
    auto_on = getattr(settings, "enable_auto_tool_choice", True)
    if opts.tool_choice is None and (not auto_on or parser not in tool_calls.PARSERS):
        opts.tool_choice = "none"  # vLLM's default without auto tool choice: tools shown, text returned
        return
    if not auto_on:
        raise invalid(field + "tool_choice", '"auto" needs ENABLE_AUTO_TOOL_CHOICE=true on this worker')
    if parser not in tool_calls.PARSERS:
        why = (f"TOOL_CALL_PARSER={configured} is not implemented here" if configured else
               "no tool-call parser is known for this model's template: set TOOL_CALL_PARSER")
        raise invalid(field + "tool_choice", f'"auto" cannot be parsed: {why} (one of {", ".join(tool_calls.PARSERS)})')
    opts.tool_choice, opts.tool_parser = "auto", parser
