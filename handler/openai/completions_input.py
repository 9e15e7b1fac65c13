"""The OpenAI form of a job (`openai_route` + `openai_input`, as worker-vllm takes
them): chat and completion requests read into a JobSpec, each refusal naming
openai_input.<field>; structured output (response_format, structured_outputs, guided_*,
a forced tool_choice) into the engine's structured_outputs."""
from __future__ import annotations

from typing import Any

from handler.errors import invalid
from handler.job.fields import parse_messages, parse_prompt
from handler.job.sampling import SAMPLING_KEYS, check_sampling, is_noop
from handler.openai.fields import SAFE_TO_IGNORE, unsupported_field
from handler.openai.sampling import output_keys, parse_output_fields
from handler.openai.structured import OPENAI_KEYS as STRUCTURED_KEYS
from handler.openai.structured import openai_structured
from handler.tools.chat_options import CHAT_KEYS, parse_chat_options
from handler.tools.forced_schema import forced_structured

# OpenAI names of engine SamplingParams fields (the others, vLLM's extensions included, pass as they are)
RENAMED = {"max_completion_tokens": "max_tokens"}
# accepted only at these (no-op) values (n, best_of, logprobs, logit_bias: handler.openai.sampling;
# top_logprobs there for chat, here for completions; echo there for completions, here for chat)
NOOP = {"top_logprobs": (0,), "echo": (False,), "suffix": ("",), "add_generation_prompt": (True,)}
IGNORED = {"stream", "stream_options"} | SAFE_TO_IGNORE  # (stream: read by _stream)


def _prompt(oi: dict, p: str) -> str | list[int]:
    if "prompt" not in oi:
        raise invalid(p + "prompt", "is required")
    prompt = oi["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]  # a batch of one
    elif isinstance(prompt, list) and prompt and all(isinstance(x, (str, list)) for x in prompt):
        raise invalid(p + "prompt", "batches of prompts are not supported: send one job per prompt")
    return parse_prompt(prompt, p + "prompt")


def _stream(oi: dict, p: str) -> tuple[bool, bool]:
    """(stream, stream_options.include_usage)."""
    stream = oi.get("stream", False)
    if not isinstance(stream, bool):
        raise invalid(p + "stream", "must be true or false")
    options = oi.get("stream_options") or {}
    if not isinstance(options, dict) or not isinstance(options.get("include_usage", False), bool):
        raise invalid(p + "stream_options", "must be {include_usage: bool}")
    return stream, options.get("include_usage", False)


def parse_openai_input(route: str, oi: Any, spec) -> None:
    """Fill `spec` from openai_input for `route`; raises invalid_input naming openai_input.<field>."""
    p = "openai_input."
    spec.openai_input = True
    if route == "/v1/models":
        if oi is not None and not isinstance(oi, dict):
            raise invalid("openai_input", "must be an object")
        return
    if not isinstance(oi, dict):
        raise invalid("openai_input", "must be an object")
    if route == "/v1/responses":
        from handler.openai.responses_input import parse_responses_input

        return parse_responses_input(oi, spec)
    if route == "/v1/chat/completions":
        if "messages" not in oi:
            raise invalid(p + "messages", "is required")
        spec.messages = parse_messages(oi["messages"], p + "messages")
        spec.chat = parse_chat_options(oi, p)
    else:
        spec.prompt = _prompt(oi, p)
    model = oi.get("model")
    if model is not None and not isinstance(model, str):
        raise invalid(p + "model", "must be a string")
    spec.stream, spec.include_usage = _stream(oi, p)
    sampling = parse_output_fields(route, oi, spec, p)  # logprobs, echo, n, best_of, logit_bias
    for key, value in oi.items():
        if key in output_keys(route):
            continue
        if key in ("messages", "prompt") or key in IGNORED or value is None:
            continue
        if key in CHAT_KEYS and spec.chat is not None:  # read by parse_chat_options
            continue
        if key in STRUCTURED_KEYS:  # read by openai_structured
            continue
        if key in NOOP:
            if not is_noop(value, NOOP[key]):
                raise invalid(p + key, f"is not supported by this worker (only {NOOP[key][0]!r})")
        elif RENAMED.get(key, key) in SAMPLING_KEYS:
            sampling[RENAMED.get(key, key)] = value
        else:
            raise unsupported_field(p, key)
    if isinstance(sampling.get("stop"), str):
        sampling["stop"] = [sampling["stop"]]
    sent_as = {new: old for old, new in RENAMED.items() if oi.get(old) is not None}
    for new, old in sent_as.items():  # OpenAI's own name wins (max_completion_tokens over max_tokens, as vLLM)
        sampling[new] = oi[old]
    structured = openai_structured(oi, p, forced_structured(spec.chat, p) if spec.chat is not None else None)
    if structured is not None:
        sampling["structured_outputs"] = structured.value
        spec.renamed["structured_outputs"] = structured.field  # the engine's refusals name it
        if spec.chat is not None:
            spec.chat.constrained = True
    spec.sampling, spec.params = check_sampling(sampling, spec, sent_as)
