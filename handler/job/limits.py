"""Size limits of a job's input (MAX_INPUT_CHARS, MAX_MESSAGES, MAX_OUTPUT_TOKENS), checked on the
parsed JobSpec before any tokenizing; each refusal is invalid_input naming the field, the limit and its setting."""
from __future__ import annotations

from typing import Any

from handler.errors import JobError


def over_limit(field: str, what: str, value: int, limit: int, setting: str) -> JobError:
    return JobError("invalid_input", f"{field}: {value:,} {what}; at most {limit:,} ({setting})",
                    field=field, limit=limit, setting=setting)


def output_cap(settings: Any) -> int | None:
    """MAX_OUTPUT_TOKENS, or None when the settings object has none."""
    return getattr(settings, "max_output_tokens", None)


def check_limits(spec, job_input: dict, settings: Any) -> None:
    """Raise invalid_input for the first limit the job's input passes."""
    max_chars = getattr(settings, "max_input_chars", None)
    max_messages = getattr(settings, "max_messages", None)
    max_tokens = output_cap(settings)
    prefix = "openai_input." if "openai_route" in job_input else ""

    if spec.summarize is not None:
        for name in ("text", "instructions"):
            value = getattr(spec.summarize, name)
            if max_chars and value and len(value) > max_chars:
                raise over_limit(f"summarize.{name}", "characters", len(value), max_chars, "MAX_INPUT_CHARS")
        if max_tokens and spec.summarize.max_tokens and spec.summarize.max_tokens > max_tokens:
            raise over_limit("summarize.max_tokens", "tokens", spec.summarize.max_tokens, max_tokens,
                             "MAX_OUTPUT_TOKENS")
    if spec.messages is not None:
        from_prompt = "prompt" in job_input and "messages" not in job_input  # apply_chat_template
        field = "prompt" if from_prompt else prefix + "messages"
        if max_messages and len(spec.messages) > max_messages:
            raise over_limit(field, "messages", len(spec.messages), max_messages, "MAX_MESSAGES")
        chars = sum(len(m["content"]) for m in spec.messages)
        if max_chars and chars > max_chars:
            raise over_limit(field, "characters of content", chars, max_chars, "MAX_INPUT_CHARS")
    if spec.prompt is not None and max_chars and len(spec.prompt) > max_chars:
        what = "characters" if isinstance(spec.prompt, str) else "token ids"
        raise over_limit(prefix + "prompt", what, len(spec.prompt), max_chars, "MAX_INPUT_CHARS")
    asked = spec.sampling.get("max_tokens")
    if max_tokens and isinstance(asked, int) and asked > max_tokens:
        oi = job_input.get("openai_input") if prefix else None
        name = "max_completion_tokens" if isinstance(oi, dict) and oi.get("max_tokens") is None else "max_tokens"
        field = prefix + name if prefix else "sampling_params.max_tokens"
        raise over_limit(field, "tokens", asked, max_tokens, "MAX_OUTPUT_TOKENS")
