"""Job input parsing and validation: worker-vllm's shapes plus ours, into one
`JobSpec`; every refusal is an invalid_input JobError naming the field."""
from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from typing import Any

from handler.errors import invalid

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models")

TOP_LEVEL_KEYS = {
    # worker-vllm
    "prompt", "messages", "sampling_params", "stream", "apply_chat_template", "use_openai_format",
    "max_batch_size", "min_batch_size", "batch_size_growth_factor", "openai_route", "openai_input",
    # ours
    "summarize", "on_truncation", "request_id", "priority", "timeout_s", "cache_salt", "tenant",
}

# engine.SamplingParams fields; max_tokens may stay unset (the worker resolves it)
SAMPLING_KEYS = {
    "max_tokens", "min_tokens", "temperature", "top_p", "top_k", "min_p", "repetition_penalty",
    "presence_penalty", "frequency_penalty", "seed", "stop", "stop_token_ids", "ignore_eos",
    "skip_special_tokens", "include_stop_str_in_output",
}
# vLLM names we accept only at their no-op value
SAMPLING_NOOP = {"n": 1, "best_of": 1, "use_beam_search": False, "logprobs": None, "prompt_logprobs": None}

ROLES = {"system", "user", "assistant", "tool", "developer"}
MAX_REQUEST_ID_LEN = 256
MAX_JSON_DEPTH = 32  # deepest nesting of lists and objects in a job's input
MAX_BATCH_SIZE = 2**31  # stream item sizes (tokens) beyond this are the same as this
MAX_TENANT_LEN = 256


@dataclass(slots=True)
class StreamBatching:
    """worker-vllm's streamed item sizes: min_size tokens first, growing by growth up to max_size."""

    max_size: int
    min_size: int
    growth: float

    def sizes(self):
        size = float(min(self.min_size, self.max_size))
        while True:
            yield max(1, int(size))
            size = min(size * self.growth, float(self.max_size))


@dataclass(slots=True)
class SummarizeSpec:
    text: str
    instructions: str | None = None
    max_tokens: int | None = None  # of the final summary


@dataclass(slots=True)
class JobSpec:
    route: str  # "generate" | "summarize" | one of ROUTES
    prompt: str | list[int] | None = None
    messages: list[dict] | None = None
    apply_chat_template: bool = False
    sampling: dict = field(default_factory=dict)
    stream: bool = False
    on_truncation: str = "flag"
    request_id: str | None = None
    priority: int = 0
    timeout_s: float | None = None
    cache_salt: str | None = None  # enters the prefix-cache block hashes (from cache_salt and/or tenant)
    batching: StreamBatching | None = None
    summarize: SummarizeSpec | None = None
    include_usage: bool = False  # OpenAI stream_options.include_usage
    fingerprint: str = ""  # hash of the input without request_id (the result cache key)
    notes: list[str] = field(default_factory=list)  # ignored inputs, logged with the job id

    @property
    def is_openai(self) -> bool:
        return self.route in ROUTES

    @property
    def result_key(self) -> str | None:
        """The result cache's key: request_id within the job's cache salt (tenants never share results)."""
        if self.request_id is None:
            return None
        return self.request_id if self.cache_salt is None else f"{self.cache_salt}\x00{self.request_id}"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond the float range
        return False


def _field_name(key: str) -> str:
    """A key as it can appear in an error (an unpaired surrogate would break the UTF-8 reply)."""
    return key.encode("utf-8", "backslashreplace").decode("utf-8")


def check_json(value: Any, path: str = "input") -> None:
    """Refuse, naming the field, what would break the worker further in: nesting deeper than
    MAX_JSON_DEPTH and strings with unpaired surrogates (a JSON escape like \\ud800, invalid UTF-8)."""
    stack = [(value, path, 0)]
    while stack:
        v, where, depth = stack.pop()
        if isinstance(v, str):
            try:
                v.encode("utf-8")
            except UnicodeEncodeError:
                raise invalid(where, "is not valid Unicode: it holds an unpaired surrogate (e.g. \\ud800)") from None
        elif isinstance(v, (dict, list)):
            if depth >= MAX_JSON_DEPTH:
                raise invalid(where, f"nests deeper than {MAX_JSON_DEPTH} levels")
            if isinstance(v, list):
                stack.extend((x, f"{where}[{i}]", depth + 1) for i, x in enumerate(v))
                continue
            for k, x in v.items():
                name = (_field_name(k) or '""') if isinstance(k, str) else repr(k)
                key_path = f"{where}.{name}" if depth else name
                if not isinstance(k, str) or name not in (k, '""'):
                    raise invalid(key_path, "keys must be valid Unicode strings")
                stack.append((x, key_path, depth + 1))


def _bool(data: dict, key: str, default: bool, prefix: str = "") -> bool:
    v = data.get(key, default)
    if v is None:
        return default
    if not isinstance(v, bool):
        raise invalid(prefix + key, "must be true or false")
    return v


def fingerprint(job_input: dict) -> str:
    body = {k: v for k, v in job_input.items() if k != "request_id"}
    blob = json.dumps(body, sort_keys=True, ensure_ascii=False, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()


def parse_messages(messages: Any, field_name: str = "messages") -> list[dict]:
    """Validate chat messages; text parts of a content list are joined; `developer` becomes `system`."""
    if not isinstance(messages, list) or not messages:
        raise invalid(field_name, "must be a non-empty list of {role, content} objects")
    out = []
    for i, m in enumerate(messages):
        where = f"{field_name}[{i}]"
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
        if not isinstance(content, str):
            raise invalid(f"{where}.content", "must be a string or a list of text parts")
        out.append({"role": "system" if role == "developer" else role, "content": content})
    return out


def parse_prompt(prompt: Any, field_name: str = "prompt") -> str | list[int]:
    if isinstance(prompt, str):
        if not prompt:
            raise invalid(field_name, "must not be empty")
        return prompt
    if isinstance(prompt, list) and prompt and all(_is_int(t) and t >= 0 for t in prompt):
        return list(prompt)
    raise invalid(field_name, "must be a non-empty string or a list of token ids")


def check_sampling(sampling: Any, prefix: str = "sampling_params.") -> dict:
    """Check names and values against engine.SamplingParams; returns the given keys only."""
    if sampling is None:
        return {}
    if not isinstance(sampling, dict):
        raise invalid(prefix.rstrip("."), "must be an object")
    out = {}
    for key, value in sampling.items():
        if key in SAMPLING_NOOP:
            if value is not None and value != SAMPLING_NOOP[key]:
                raise invalid(prefix + key, f"only {SAMPLING_NOOP[key]!r} is supported")
            continue
        if key not in SAMPLING_KEYS:
            raise invalid(prefix + key, "unknown sampling parameter; supported: " + ", ".join(sorted(SAMPLING_KEYS)))
        if value is None:
            continue
        out[key] = value
    from engine.errors import InvalidInputError
    from engine.sampling_params import SamplingParams

    try:
        SamplingParams(**out)
    except InvalidInputError as exc:
        name = getattr(exc, "field", None) or "sampling_params"
        raise invalid(prefix + name, exc.message.removeprefix("sampling params: ")) from None
    except TypeError as exc:
        raise invalid(prefix.rstrip("."), str(exc)) from None
    return out


def _batching(data: dict, settings: Any) -> StreamBatching:
    def get(key, default, minimum, kind):
        v = data.get(key)
        if v is None:
            return default
        if kind is int and not _is_int(v) or kind is float and not _is_num(v) or v < minimum:
            raise invalid(key, f"must be a number >= {minimum}")
        return min(v, MAX_BATCH_SIZE)

    return StreamBatching(
        max_size=get("max_batch_size", settings.default_batch_size, 1, int),
        min_size=get("min_batch_size", settings.min_batch_size, 1, int),
        growth=float(get("batch_size_growth_factor", settings.batch_size_growth_factor, 1, float)),
    )


def _summarize(value: Any) -> SummarizeSpec:
    if isinstance(value, str):
        value = {"text": value}
    if not isinstance(value, dict):
        raise invalid("summarize", "must be the document text or {text, instructions, max_tokens}")
    unknown = set(value) - {"text", "document", "instructions", "max_tokens"}
    if unknown:
        raise invalid(f"summarize.{sorted(unknown)[0]}", "unknown key; use text, instructions, max_tokens")
    text = value.get("text", value.get("document"))
    if not isinstance(text, str) or not text.strip():
        raise invalid("summarize.text", "must be a non-empty string")
    instructions = value.get("instructions")
    if instructions is not None and (not isinstance(instructions, str) or not instructions.strip()):
        raise invalid("summarize.instructions", "must be a non-empty string")
    max_tokens = value.get("max_tokens")
    if max_tokens is not None and (not _is_int(max_tokens) or max_tokens < 1):
        raise invalid("summarize.max_tokens", "must be an integer >= 1")
    return SummarizeSpec(text=text, instructions=instructions, max_tokens=max_tokens)


def parse_job_input(job_input: Any, settings: Any) -> JobSpec:
    """The job's `input` as a JobSpec; raises JobError(invalid_input) naming the field
    (also for input over the size limits of handler.limits)."""
    from handler.limits import check_limits

    spec = _parse_job_input(job_input, settings)
    check_limits(spec, job_input, settings)
    return spec


def _cache_salt(job_input: dict) -> str | None:
    """cache_salt as given; with a tenant, a salt derived from both (so no tenant can name another's salt
    by accident)."""
    salt, tenant = job_input.get("cache_salt"), job_input.get("tenant")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise invalid("cache_salt", "must be a non-empty string")
    if tenant is None:
        return salt
    if not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_LEN:
        raise invalid("tenant", f"must be a non-empty string of at most {MAX_TENANT_LEN} characters")
    blob = json.dumps(["tenant", tenant, salt], ensure_ascii=False).encode()
    return "tenant-" + hashlib.sha256(blob).hexdigest()


def _parse_job_input(job_input: Any, settings: Any) -> JobSpec:
    if not isinstance(job_input, dict):
        raise invalid("input", "must be a JSON object")
    check_json(job_input)
    for key in job_input:
        if key not in TOP_LEVEL_KEYS:
            raise invalid(key or '""', "unknown input key; expected one of " + ", ".join(sorted(TOP_LEVEL_KEYS)))
    spec = JobSpec(route="generate", fingerprint=fingerprint(job_input))

    rid = job_input.get("request_id")
    if rid is not None:
        if not isinstance(rid, str) or not rid or len(rid) > MAX_REQUEST_ID_LEN:
            raise invalid("request_id", f"must be a non-empty string of at most {MAX_REQUEST_ID_LEN} characters")
        spec.request_id = rid
    priority = job_input.get("priority", 0)
    if not _is_int(priority) or abs(priority) >= 2**31:
        raise invalid("priority", "must be an integer (lower runs first)")
    spec.priority = priority
    timeout = job_input.get("timeout_s")
    if timeout is not None:
        if not _is_num(timeout) or timeout <= 0:
            raise invalid("timeout_s", "must be a number > 0")
        spec.timeout_s = float(timeout)
    elif settings.job_timeout_s:
        spec.timeout_s = float(settings.job_timeout_s)
    spec.cache_salt = _cache_salt(job_input)
    policy = job_input.get("on_truncation", "flag")
    if policy not in ("flag", "error"):
        raise invalid("on_truncation", 'must be "flag" or "error"')
    spec.on_truncation = policy
    spec.stream = _bool(job_input, "stream", False)
    spec.batching = _batching(job_input, settings)

    route = job_input.get("openai_route")
    if route is not None:
        from handler.openai_routes import parse_openai_input

        if route not in ROUTES:
            raise invalid("openai_route", "must be one of " + ", ".join(ROUTES))
        for key in ("prompt", "messages", "summarize", "sampling_params"):
            if key in job_input:
                raise invalid(key, "not allowed with openai_route (put it in openai_input)")
        spec.route = route
        parse_openai_input(route, job_input.get("openai_input"), spec)
        return spec

    present = [k for k in ("prompt", "messages", "summarize") if job_input.get(k) is not None]
    if not present:
        raise invalid("prompt", "one of prompt, messages, summarize or openai_route is required")
    if len(present) > 1:
        raise invalid(present[1], f"give only one of prompt, messages, summarize (got {', '.join(present)})")
    if "openai_input" in job_input:
        raise invalid("openai_input", "needs openai_route")
    spec.sampling = check_sampling(job_input.get("sampling_params"))
    spec.apply_chat_template = _bool(job_input, "apply_chat_template", False)
    use_openai = _bool(job_input, "use_openai_format", False)
    if present[0] == "summarize":
        spec.route = "summarize"
        spec.summarize = _summarize(job_input["summarize"])
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
    return spec

