"""The Responses API request (`/v1/responses`, as the `openai` package's
`responses.create` sends it) read into a JobSpec: `input` (text, or message,
function_call and function_call_output items) and `instructions` as chat messages,
`tools` in its flat form, sampling by OpenAI's names, `text.format` and a forced tool_choice
as structured output; refusals name openai_input.<field>."""
from __future__ import annotations

from typing import Any

from handler.errors import invalid
from handler.job.fields import parse_messages
from handler.job.sampling import check_sampling
from handler.job.structured import Structured
from handler.openai.fields import SAFE_TO_IGNORE, unsupported_field
from handler.openai.structured import one_source, response_format
from handler.tools.chat_options import parse_chat_options
from handler.tools.forced_schema import forced_structured

P = "openai_input."
SAMPLING = {"max_output_tokens": "max_tokens", "temperature": "temperature", "top_p": "top_p"}
# accepted at these values only (what they change is not implemented)
AT = {"truncation": ("disabled",), "background": (False,), "top_logprobs": (0,), "include": ([],)}
READ = {"input", "instructions", "tools", "tool_choice", "parallel_tool_calls", "stream", "text", "reasoning",
        "stream_options"} | set(SAMPLING)


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") not in ("input_text", "output_text", "text") \
                    or not isinstance(part.get("text"), str):
                raise invalid(f"{where}[{j}]", "only text parts ({type: input_text, text}) are supported")
            parts.append(part["text"])
        return "\n".join(parts)
    raise invalid(where, "must be a string or a list of text parts")


def input_messages(value: Any, instructions: Any) -> list[dict]:
    """Chat messages of `instructions` + `input`; consecutive function_call items become one
    assistant turn's tool_calls, a function_call_output a tool message."""
    messages: list[dict] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise invalid(P + "instructions", "must be a string")
        messages.append({"role": "system", "content": instructions})
    if isinstance(value, str):
        return messages + [{"role": "user", "content": value}]
    if not isinstance(value, list) or not value:
        raise invalid(P + "input", "must be a string or a non-empty list of input items")
    for i, item in enumerate(value):
        where = f"{P}input[{i}]"
        kind = item.get("type", "message") if isinstance(item, dict) else None
        if kind == "message":
            messages.append({"role": item.get("role"), "content": _text(item.get("content"), where + ".content")})
        elif kind == "function_call":
            call = {"id": item.get("call_id"), "type": "function",
                    "function": {"name": item.get("name"), "arguments": item.get("arguments", "{}")}}
            last = messages[-1] if messages else None
            if last and last["role"] == "assistant" and last.get("tool_calls") and last["content"] is None:
                last["tool_calls"].append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item.get("output")
            output = output if isinstance(output, str) else _text(output, where + ".output")
            messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": output})
        elif kind == "reasoning":
            continue  # our own earlier reasoning sent back: chat templates drop past reasoning too
        else:
            raise invalid(where + ".type", "only message, function_call, function_call_output and reasoning "
                          "items are supported")
    return parse_messages(messages, P + "input")


def _text_format(text: Any) -> Structured | None:
    """The structured output of `text.format` (None for text or none given)."""
    if text is None:
        return None
    if not isinstance(text, dict):
        raise invalid(P + "text", "must be an object {format, verbosity}")
    fmt = text.get("format")
    fields = None if fmt is None else response_format(fmt, P + "text.format", flat=True)
    return None if fields is None else Structured(fields, "text.format", "text.format")


def parse_responses_input(oi: dict, spec) -> None:
    for key, value in oi.items():
        if value is None or key in READ or key in SAFE_TO_IGNORE:
            continue
        if key in AT and value in AT[key]:
            continue
        if key == "previous_response_id" or key == "conversation":
            raise invalid(P + key, "this worker stores no responses: send the whole conversation as input")
        raise unsupported_field(P, key)
    if "input" not in oi:
        raise invalid(P + "input", "is required")
    spec.messages = input_messages(oi["input"], oi.get("instructions"))
    spec.chat = parse_chat_options(oi, P, flat_tools=True)
    text_format = _text_format(oi.get("text"))
    reasoning = oi.get("reasoning")
    if reasoning is not None and not isinstance(reasoning, dict):
        raise invalid(P + "reasoning", "must be an object")  # effort, summary: the model's template decides
    stream = oi.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid(P + "stream", "must be true or false")
    spec.stream = stream
    sampling = {SAMPLING[k]: oi[k] for k in SAMPLING if oi.get(k) is not None}
    sent_as = {"max_tokens": "max_output_tokens"} if "max_tokens" in sampling else {}
    order = list(oi)  # in the order the client sent them: a second is refused
    sources = sorted((s for s in (text_format, forced_structured(spec.chat, P, flat=True)) if s is not None),
                     key=lambda s: order.index(s.sent.split(".")[0]))
    structured = one_source(sources, P)
    if structured is not None:
        sampling["structured_outputs"] = structured.value
        spec.renamed["structured_outputs"] = structured.field
        spec.chat.constrained = True
    spec.sampling, spec.params = check_sampling(sampling, spec, sent_as)
    spec.chat.request = {k: oi[k] for k in ("instructions", "metadata", "temperature", "top_p", "max_output_tokens",
                                            "user", "tools") if oi.get(k) is not None}  # the Response echoes them
    if text_format is not None:
        spec.chat.request["text"] = {"format": oi["text"]["format"]}
