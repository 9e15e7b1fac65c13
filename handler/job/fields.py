"""Checks of single values in a job's input, each refusal naming the field:
JSON depth and Unicode, booleans, chat messages, prompts, unknown keys' names; and the
input's fingerprint."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from engine.sampling_params import are_token_ids
from handler.errors import JobError, invalid

ROLES = {"system", "user", "assistant", "tool", "developer"}
MAX_JSON_DEPTH = 32  # deepest nesting of lists and objects in a job's input
MAX_KEY_CHARS = 100  # of an unknown key's name as an error names it
SCALARS = frozenset({int, float, bool, type(None)})  # JSON values with nothing inside to check


def field_name(key: str) -> str:
    """A key as it can appear in an error (an unpaired surrogate would break the UTF-8 reply)."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def named_key(key: str) -> str:
    """An unknown key as an error names it: as sent (the error's JSON carries any character, the
    log escapes them: handler.logs), cut after MAX_KEY_CHARS."""
    cut = len(key) - MAX_KEY_CHARS
    return key if cut <= 0 else f"{key[:MAX_KEY_CHARS]}... ({cut:,} more characters)"


def _valid_unicode(strings) -> bool:
    """No unpaired surrogate in any of the strings (one C-speed pass over them all)."""
    try:
        "".join(strings).encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def check_json(value: Any, path: str = "input") -> None:
    """Refuse, naming the field, what would break the worker further in: nesting deeper than
    MAX_JSON_DEPTH and strings with unpaired surrogates (a JSON escape like \\ud800, invalid UTF-8).
    Numbers cost nothing and lists of strings one pass, so a million token ids check in milliseconds."""
    stack = [(value, path, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, str):
            if not _valid_unicode((v,)):
                raise invalid(where, "is not valid Unicode: it holds an unpaired surrogate (e.g. \\ud800)")
        elif isinstance(v, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise invalid(where, f"nests deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(v, list):
                kinds = set(map(type, v))
                if kinds <= SCALARS or kinds == {str} and _valid_unicode(v):
                    continue
                stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v) if type(x) not in SCALARS)
                continue
            keys_fine = set(map(type, v)) <= {str} and _valid_unicode(v)
            for k, x in v.items():
                if keys_fine and type(x) in SCALARS:
                    continue
                name = (field_name(k) or '""') if isinstance(k, str) else repr(k)
                key_path = f"{where}.{name}" if depth else name
                if not isinstance(k, str) or name not in (k, '""'):
                    raise invalid(key_path, "keys must be valid Unicode strings")
                stack.append((x, key_path, depth + 1))


def parse_bool(data: dict, key: str, default: bool, prefix: str = "") -> bool:
    v = data.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid(prefix + key, "must be true or false")
    return v


def fingerprint(job_input: dict) -> str:
    """A hash of the input without request_id: the result cache's check that a reused id asks the same."""
    body = {k: v for k, v in job_input.items() if k != "request_id"}
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def parse_messages(messages: Any, field: str = "messages") -> list[dict]:
    """Validate chat messages; text parts of a content list are joined; `developer` becomes `system`."""
    if not isinstance(messages, list) or not messages:
        raise invalid(field, "must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"{field}[{i}]"
        if not isinstance(m, dict):
            raise invalid(where, "must be an object with role and content")
        role = m.get("role")
        if not isinstance(role, str) or role not in ROLES:
            raise invalid(f"{where}.role", f"must be one of {', '.join(sorted(ROLES))}")
        content = m.get("content")
        if isinstance(content, list):
            texts = []
            for j, part in enumerate(content):
                if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                    raise invalid(f"{where}.content[{j}]", "only text parts ({type: text, text}) are supported")
                texts.append(part["text"])
            content = "\n".join(texts)
        calls = m.get("tool_calls") if role == "assistant" else None
        if content is None and calls:
            content = None  # an assistant turn of tool calls only
        elif not isinstance(content, str):
            raise invalid(f"{where}.content", "must be a string or a list of text parts")
        message = {"role": "system" if role == "developer" else role, "content": content}
        message.update(_tool_fields(m, role, where))
        out.append(message)
    return out


def _tool_fields(m: dict, role: str, where: str) -> dict:
    """An assistant message's tool_calls (arguments parsed: chat templates render them as objects,
    as vLLM hands them), a tool message's tool_call_id, a message's name."""
    import json

    out: dict[str, Any] = {}
    for key in ("name", "tool_call_id", "reasoning_content"):
        value = m.get(key)
        if value is not None:
            if not isinstance(value, str):
                raise invalid(f"{where}.{key}", "must be a string")
            out[key] = value
    if role == "tool" and "tool_call_id" not in out:
        raise invalid(f"{where}.tool_call_id", "is required in a tool message")
    calls = m.get("tool_calls")
    if calls is None or role != "assistant":
        return out
    if not isinstance(calls, list):
        raise invalid(f"{where}.tool_calls", "must be a list")
    out["tool_calls"] = []
    for j, call in enumerate(calls):
        at = f"{where}.tool_calls[{j}]"
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise invalid(at, 'must be {"id", "type": "function", "function": {"name", "arguments"}}')
        args = fn.get("arguments", "{}")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except RecursionError:  # nested past the parser's limit: as deep as check_json refuses
            raise invalid(at + ".function.arguments", f"nests deeper than {MAX_JSON_DEPTH} levels") from None
        except ValueError:
            raise invalid(at + ".function.arguments", "must be a JSON object's text") from None
        if not isinstance(args, dict):
            raise invalid(at + ".function.arguments", "must be a JSON object's text")
        try:  # the template walks it: as deep as any input may nest
            check_json(args, "arguments")
        except JobError as exc:
            raise invalid(at + ".function.arguments", exc.message.split(": ", 1)[-1]) from None
        out["tool_calls"].append({"id": str(call.get("id") or f"call_{j}"), "type": "function",
                                  "function": {"name": fn["name"], "arguments": args}})
    return out


def parse_prompt(prompt: Any, field: str = "prompt") -> str | list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise invalid(field, "must not be empty")
        return prompt
    if isinstance(prompt, list) and prompt and are_token_ids(prompt):
        return list(prompt)
    raise invalid(field, "must be a non-empty string or a list of token ids")
