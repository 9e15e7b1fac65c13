"""A chat request's tool and template fields (`tools`, `tool_choice`, `parallel_tool_calls`,
`chat_template_kwargs`) as `ChatOptions`, checked at parse time; the parsers the model's
output goes through are chosen once the model is known (`resolve_parsers`). A forced
tool_choice ("required", a named function) is served by structured output
(handler.tools.forced_schema), its calls read by handler.tools.forced_calls. `setup_chat`
resolves a job's parsers against its engine's chat template."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from handler.errors import invalid

TOOL_NAME = re.compile(r"^[A-Za-z0-9_.:-]{1,64}$")
CHAT_KEYS = ("tools", "tool_choice", "parallel_tool_calls", "chat_template_kwargs")
CHOICES = '"none", "auto", "required" or {"type": "function", ...}'


@dataclass(slots=True)
class ChatOptions:
    tools: list[dict] | None = None  # OpenAI chat form: [{type: function, function: {name, ...}}]
    # "none" | "auto" | "required" | "named" (tool_name); None: not given (auto when a parser is known)
    tool_choice: str | None = None
    tool_name: str | None = None  # the function a named tool_choice forces
    parallel_tool_calls: bool = True
    template_kwargs: dict | None = None  # chat_template_kwargs
    tool_parser: str | None = None  # set by resolve_parsers (handler.tools.tool_calls)
    reasoning_parser: str | None = None  # set by resolve_parsers (handler.tools.reasoning)
    request: dict | None = None  # a Responses request's fields its Response echoes
    # the output is structured output (response_format, guided_*, a forced tool_choice): its
    # shape is the constraint's from the first token, so no reasoning or tool-call parser reads it
    constrained: bool = False

    def prompt_fields(self) -> dict:
        """What the engine's input processor takes beside the messages."""
        out: dict[str, Any] = {}
        if self.tools:  # rendered with tool_choice "none" (and forced choices) too, as vLLM does
            out["tools"] = self.tools
        if self.template_kwargs:
            out["chat_template_kwargs"] = self.template_kwargs
        return out

    @property
    def forced(self) -> bool:
        """The tool_choice forces calls ("required" or a named function)."""
        return self.tool_choice in ("required", "named")

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
    return {"type": "function", "function": out}


def _is_strict(tool: Any, flat: bool) -> bool:
    fn = tool if flat else tool.get("function")
    return fn.get("strict") is True


def parse_tool_choice(value: Any, where: str, flat: bool = False) -> tuple[str | None, str | None]:
    """(tool_choice, the named function's name); `flat`: the Responses API's {type, name}."""
    if value is None or value in ("none", "auto", "required"):
        return value, None
    if isinstance(value, dict) and value.get("type") == "function":
        fn = value if flat else value.get("function")
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            shape = '{"type": "function", "name": ...}' if flat else '{"type": "function", "function": {"name": ...}}'
            raise invalid(where, f"a named tool choice is {shape}")
        return "named", name
    raise invalid(where, "must be " + CHOICES)


def parse_chat_options(oi: dict, p: str, flat_tools: bool = False) -> ChatOptions:
    """The ChatOptions of an OpenAI request (`p`: the field prefix, e.g. "openai_input.")."""
    opts = ChatOptions()
    tools = oi.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise invalid(p + "tools", "must be a list of tool definitions")
        opts.tools = [parse_tool(t, f"{p}tools[{i}]", flat_tools) for i, t in enumerate(tools)] or None
    opts.tool_choice, opts.tool_name = parse_tool_choice(oi.get("tool_choice"), p + "tool_choice", flat_tools)
    if opts.forced and not opts.tools:
        raise invalid(p + "tool_choice", "forces a tool call but the request has no tools")
    names = [t["function"]["name"] for t in opts.tools or ()]
    if opts.tool_name is not None and opts.tool_name not in names:
        shown = ", ".join(names[:20]) + (f", ... ({len(names) - 20} more)" if len(names) > 20 else "")
        raise invalid(p + "tool_choice", f"names the function {opts.tool_name!r:.80}, which is not among the "
                      f"tools ({shown})")
    for i, tool in enumerate(tools or ()):
        if _is_strict(tool, flat_tools) and opts.tool_choice != "none" and not opts.forced:
            raise invalid(f"{p}tools[{i}]{'' if flat_tools else '.function'}.strict", "strict calls follow the "
                          'schema only when tool_choice forces them ("required" or a named function); "auto" '
                          "calls are parsed from the model's free text")
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
    REASONING_PARSER; tool calls (when tools are given and tool_choice is "auto" or not given)
    by TOOL_CALL_PARSER, else from the template's own markers. Raises invalid_input naming
    `field` + tools / tool_choice when the request cannot be served as asked. A forced
    tool_choice needs no parser (its calls are structured output); no constrained output
    goes through a parser."""
    from handler.tools import reasoning, tool_calls

    name = (getattr(settings, "reasoning_parser", None) or "").lower()
    opts.reasoning_parser = name if name in reasoning.PARSERS and not opts.constrained else None
    if not opts.tools or opts.tool_choice == "none" or opts.forced:
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
    opts.tool_choice = "auto"
    opts.tool_parser = None if opts.constrained else parser


def setup_chat(run) -> None:
    """Resolve the job's parsers against the model's chat template (raises invalid_input when
    tools cannot be served as asked); a parser whose marker is a special token gets it decoded."""
    from handler.tools.tool_calls import tool_parser

    spec = run.spec
    if spec.chat is None:
        return
    template = getattr(run.engine.tokenizer, "chat_template", None)
    resolve_parsers(spec.chat, run.settings, template if isinstance(template, str) else None, "openai_input.")
    parser = spec.chat.tool_parser
    if parser and tool_parser(parser).needs_special_tokens and "skip_special_tokens" not in spec.sampling:
        spec.params.skip_special_tokens = False
