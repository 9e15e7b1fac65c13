"""Size limits of a job's input (MAX_INPUT_CHARS over every field a client sizes, MAX_MESSAGES,
MAX_OUTPUT_TOKENS, MAX_BAD_WORDS, and the stop lists' MAX_STOP_STRINGS, MAX_STOP_CHARS,
MAX_STOP_TOKEN_IDS), checked on the parsed JobSpec before any tokenizing; each refusal is
invalid_input naming the field, the limit and its setting."""
from __future__ import annotations

from typing import Any

from handler.errors import JobError


def over_limit(field: str, what: str, value: int, limit: int, setting: str) -> JobError:
    return JobError("invalid_input", f"{field}: {value:,} {what}; at most {limit:,} ({setting})",
                    field=field, limit=limit, setting=setting)


def output_cap(settings: Any) -> int | None:
    """MAX_OUTPUT_TOKENS, or None when the settings object has none."""
    return getattr(settings, "max_output_tokens", None)


def precheck_counts(job_input: Any, settings: Any) -> None:
    """Message counts checked before the full parse walks them (a million messages are
    refused at once, not after a second of validation on the event loop)."""
    max_messages = getattr(settings, "max_messages", None)
    if not max_messages or not isinstance(job_input, dict):
        return
    openai = job_input.get("openai_input")
    candidates = [("messages", job_input.get("messages")),
                  ("openai_input.messages", openai.get("messages") if isinstance(openai, dict) else None)]
    prompt = job_input.get("prompt")
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):  # apply_chat_template
        candidates.append(("prompt", prompt))
    for field, value in candidates:
        if isinstance(value, list) and len(value) > max_messages:
            raise over_limit(field, "messages", len(value), max_messages, "MAX_MESSAGES")


def check_limits(spec, job_input: dict, settings: Any) -> None:
    """Raise invalid_input for the first limit the job's input passes."""
    max_chars = getattr(settings, "max_input_chars", None)
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
    check_input_chars(_sized_fields(spec, job_input, prefix, settings), max_chars)
    asked = spec.sampling.get("max_tokens")
    if max_tokens and isinstance(asked, int) and asked > max_tokens:
        oi = job_input.get("openai_input") if prefix else None
        given = isinstance(oi, dict) and oi.get("max_completion_tokens") is not None  # it wins over max_tokens
        name = "max_completion_tokens" if given else "max_tokens"
        field = prefix + name if prefix else "sampling_params.max_tokens"
        raise over_limit(field, "tokens", asked, max_tokens, "MAX_OUTPUT_TOKENS")
    check_stop_limits(spec, settings)


def _sized_fields(spec, job_input: dict, prefix: str, settings: Any) -> list[tuple[str, int, str]]:
    """(field, size, unit) of each field of the request a client sizes: the prompt, or the messages'
    contents, their tool calls and the tool definitions (characters of their JSON); the bad_words
    (MAX_BAD_WORDS checked here)."""
    parts: list[tuple[str, int, str]] = []
    if spec.messages is not None:
        from_prompt = "prompt" in job_input and "messages" not in job_input  # apply_chat_template
        field = "prompt" if from_prompt else prefix + "messages"
        max_messages = getattr(settings, "max_messages", None)
        if max_messages and len(spec.messages) > max_messages:
            raise over_limit(field, "messages", len(spec.messages), max_messages, "MAX_MESSAGES")
        parts.append((field, sum(len(m["content"] or "") for m in spec.messages), "characters of content"))
        parts += [(f"{field}[{i}].tool_calls", json_chars(m["tool_calls"]), "characters of tool calls")
                  for i, m in enumerate(spec.messages) if m.get("tool_calls")]
    if spec.chat is not None and spec.chat.tools:
        parts.append((prefix + "tools", json_chars(spec.chat.tools), "characters of tool definitions"))
    if spec.prompt is not None:
        parts.append((prefix + "prompt", len(spec.prompt), "characters" if isinstance(spec.prompt, str) else
                      "token ids"))
    bad_words = spec.sampling.get("bad_words") or []
    if bad_words:
        most = getattr(settings, "max_bad_words", None)
        if most and len(bad_words) > most:
            raise over_limit(spec.field("bad_words"), "bad words", len(bad_words), most, "MAX_BAD_WORDS")
        parts.append((spec.field("bad_words"), sum(map(len, bad_words)), "characters of bad words"))
    return parts


def json_chars(value: Any) -> int:
    """Characters of a JSON value's strings and keys (a number or a literal counts 1): what
    rendering it into a prompt costs."""
    total, stack = 0, [value]
    while stack:
        v = stack.pop()
        if isinstance(v, str):
            total += len(v)
        elif isinstance(v, dict):
            total += sum(len(k) for k in v if isinstance(k, str))
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
        else:
            total += 1
    return total


def check_input_chars(parts: list[tuple[str, int, str]], max_chars: int | None) -> None:
    """MAX_INPUT_CHARS over the sized fields together; a refusal names the largest."""
    total = sum(n for _, n, _ in parts)
    if not max_chars or total <= max_chars:
        return
    field, largest, unit = max(parts, key=lambda part: part[1])
    if largest < total:
        unit = f"characters of the input together ({largest:,} in {field})"
    raise over_limit(field, unit, total, max_chars, "MAX_INPUT_CHARS")


def check_stop_limits(spec, settings: Any) -> None:
    """MAX_STOP_STRINGS, MAX_STOP_CHARS (all stop strings together) and MAX_STOP_TOKEN_IDS, on the
    checked sampling values (a lone stop string counts as a list of one)."""
    stop = spec.sampling.get("stop") or []
    stops = [stop] if isinstance(stop, str) else stop
    most, most_chars = getattr(settings, "max_stop_strings", None), getattr(settings, "max_stop_chars", None)
    if most and len(stops) > most:
        raise over_limit(spec.field("stop"), "stop strings", len(stops), most, "MAX_STOP_STRINGS")
    chars = sum(map(len, stops))
    if most_chars and chars > most_chars:
        raise over_limit(spec.field("stop"), "characters of stop strings", chars, most_chars, "MAX_STOP_CHARS")
    ids, most_ids = spec.sampling.get("stop_token_ids") or [], getattr(settings, "max_stop_token_ids", None)
    if most_ids and len(ids) > most_ids:
        raise over_limit(spec.field("stop_token_ids"), "stop token ids", len(ids), most_ids, "MAX_STOP_TOKEN_IDS")
