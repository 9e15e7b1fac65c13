"""worker-vllm's own job form, read into a JobSpec: `prompt` (text or token ids), `messages`, or
(ours) `summarize`, with `sampling_params`, `apply_chat_template` and `use_openai_format`."""
from __future__ import annotations

from typing import Any

from engine.validation import is_int
from handler.errors import invalid
from handler.job.fields import named_key, parse_bool, parse_messages, parse_prompt
from handler.job.sampling import check_sampling
from handler.job.schema import JobSpec, SummarizeSpec


def parse_summarize(value: Any) -> SummarizeSpec:
    """A summarize job's document: its text, or {text (or document), instructions, max_tokens}."""
    if isinstance(value, str):
        value = {"text": value}
    if not isinstance(value, dict):
        raise invalid("summarize", "must be the document text or {text, instructions, max_tokens}")
    unknown = set(value) - {"text", "document", "instructions", "max_tokens"}
    if unknown:
        raise invalid(f"summarize.{named_key(sorted(unknown)[0])}",
                      "unknown key; use text, instructions, max_tokens")
    text = value.get("text", value.get("document"))
    if not isinstance(text, str) or not text.strip():
        raise invalid("summarize.text", "must be a non-empty string")
    instructions = value.get("instructions")
    if instructions is not None and (not isinstance(instructions, str) or not instructions.strip()):
        raise invalid("summarize.instructions", "must be a non-empty string")
    max_tokens = value.get("max_tokens")
    if max_tokens is not None and (not is_int(max_tokens) or max_tokens < 1):
        raise invalid("summarize.max_tokens", "must be an integer >= 1")
    return SummarizeSpec(text=text, instructions=instructions, max_tokens=max_tokens)




def parse_native_request(job_input: dict, spec: JobSpec) -> None:
    """worker-vllm's own request: prompt, messages or (ours) summarize, with sampling_params."""
    present = [k for k in ("prompt", "messages", "summarize") if job_input.get(k) is not None]
    if not present:
        raise invalid("prompt", "one of prompt, messages, summarize or openai_route is required")
    if len(present) > 1:
        raise invalid(present[1], f"give only one of prompt, messages, summarize (got {', '.join(present)})")
    if "openai_input" in job_input:
        raise invalid("openai_input", "needs openai_route")
    spec.sampling, spec.params = check_sampling(job_input.get("sampling_params"), spec)
    spec.apply_chat_template = parse_bool(job_input, "apply_chat_template", False)
    use_openai = parse_bool(job_input, "use_openai_format", False)
    if present[0] == "summarize":
        spec.route = "summarize"
        if "structured_outputs" in spec.sampling:  # it would shape every partial summary too
            raise invalid(spec.field("structured_outputs"), "structured output is not supported with summarize")
        spec.summarize = parse_summarize(job_input["summarize"])
    elif present[0] == "messages":
        spec.messages = parse_messages(job_input["messages"])
        if use_openai:
            spec.route = "/v1/chat/completions"
    else:
        spec.prompt = parse_prompt(job_input["prompt"])
        if spec.apply_chat_template:
            if not isinstance(spec.prompt, str):
                raise invalid("apply_chat_template", "needs a text prompt")
            spec.messages = [{"role": "user", "content": spec.prompt}]
            spec.prompt = None
        if use_openai:
            spec.route = "/v1/chat/completions" if spec.messages else "/v1/completions"
