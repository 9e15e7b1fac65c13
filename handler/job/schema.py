"""The job's schema: `JobSpec`, what a job asks whichever form it came in (native, OpenAI), and
the options any job may give beside its request (request_id, priority, deadline, cache salt,
truncation policy, streaming); every refusal an invalid_input JobError naming the field."""
from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from engine.validation import is_int, is_number
from handler.errors import invalid
from handler.job.fields import check_json, fingerprint, named_key, parse_bool
from handler.logs import has_control_chars
from handler.result_cache import ResultKey

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/v1/responses")

TOP_LEVEL_KEYS = {
    # worker-vllm
    "prompt", "messages", "sampling_params", "stream", "apply_chat_template", "use_openai_format",
    "max_batch_size", "min_batch_size", "batch_size_growth_factor", "openai_route", "openai_input",
    "route", "method", "body",  # its newer generic proxy form (handler.openai.route_body)
    # ours
    "summarize", "on_truncation", "request_id", "priority", "timeout_s", "cache_salt", "tenant",
    "model", "lora",  # the model or LoRA adapter to run (handler.lora.select)
}

MAX_REQUEST_ID_LEN = 256
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
    sampling: dict = field(default_factory=dict)  # the sampling values as the job gave them (engine names)
    params: Any = None  # engine.SamplingParams of `sampling`, built once when they were checked
    stream: bool = False
    on_truncation: str = "flag"
    idempotency_key: str | None = None  # the job's `request_id`: the same one returns the stored result
    priority: int = 0
    timeout_s: float | None = None
    cache_salt: str | None = None  # enters the prefix-cache block hashes (derived from cache_salt and/or tenant)
    batching: StreamBatching | None = None
    summarize: SummarizeSpec | None = None
    include_usage: bool = False  # OpenAI stream_options.include_usage
    echo: bool = False  # OpenAI completions: the prompt's text (and logprobs) before the completion
    chat: Any = None  # handler.tools.chat_options.ChatOptions: tools, tool_choice, chat_template_kwargs, parsers
    openai_input: bool = False  # its request fields sit under openai_input (an openai_route job)
    fingerprint: str = ""  # hash of the input without request_id (the result cache key)
    # engine field -> the job's field that gave it, when the names differ (structured_outputs
    # from response_format, guided_json, a forced tool_choice's tools, ...): what its errors name
    renamed: dict[str, str] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # ignored inputs, logged with the job id
    lora: str | None = None  # the LoRA adapter the job runs with (its name); None: the base model
    lora_field: str | None = None  # the job's field that picks the model or adapter (its errors name it)
    lora_request: Any = None  # engine.LoRARequest of `lora`, set when the job runs (the adapters loaded)

    @property
    def is_openai(self) -> bool:
        return self.route in ROUTES

    @property
    def result_key(self) -> ResultKey | None:
        """The result cache's key: request_id within the job's cache salt (tenants never share results)."""
        if self.idempotency_key is None:
            return None
        return ResultKey(self.cache_salt, self.idempotency_key)

    def field(self, engine_field: str | None) -> str:
        """The job input field an engine error's field stands for: the prompt and messages,
        or a sampling value (under sampling_params, or openai_input for an OpenAI job)."""
        name = "prompt" if engine_field == "prompt_token_ids" else engine_field or "sampling_params"
        name = self.renamed.get(name, name)
        if self.route == "summarize" and name.startswith(("prompt", "messages")):
            return "summarize.text"
        if name.startswith("messages") and self.apply_chat_template:
            return "prompt"
        sampling = name == "prompt_logprobs" or not name.startswith(("prompt", "messages", "sampling_params"))
        if sampling and not self.openai_input:
            name = "sampling_params." + name
        if self.openai_input:
            return "openai_input" if name == "sampling_params" else "openai_input." + name
        return name


def _batching(data: dict, settings: Any) -> StreamBatching:
    def get(key, default, minimum, kind):
        v = data.get(key)
        if v is None:
            return default
        if kind is int and not is_int(v) or kind is float and not is_number(v) or v < minimum:
            raise invalid(key, f"must be a number >= {minimum}")
        return min(v, MAX_BATCH_SIZE)

    return StreamBatching(
        max_size=get("max_batch_size", settings.default_batch_size, 1, int),
        min_size=get("min_batch_size", settings.min_batch_size, 1, int),
        growth=float(get("batch_size_growth_factor", settings.batch_size_growth_factor, 1, float)),
    )


def _cache_salt(job_input: dict) -> str | None:
    """The engine's cache salt: None without cache_salt and tenant; else a hash in one of two
    namespaces, `salt:` for a cache_salt alone and `tenant:` for a tenant (with its cache_salt, if
    any), so no cache_salt a client sends can ever equal a tenant's salt (nor contain a NUL)."""
    salt, tenant = job_input.get("cache_salt"), job_input.get("tenant")
    if salt is not None and (not isinstance(salt, str) or not salt):
        raise invalid("cache_salt", "must be a non-empty string")
    if tenant is None:
        return None if salt is None else "salt:" + _sha256(["salt", salt])
    if not isinstance(tenant, str) or not tenant or len(tenant) > MAX_TENANT_LEN:
        raise invalid("tenant", f"must be a non-empty string of at most {MAX_TENANT_LEN} characters")
    return "tenant:" + _sha256(["tenant", tenant, salt])


def _sha256(parts: list) -> str:
    return hashlib.sha256(json.dumps(parts, ensure_ascii=False).encode()).hexdigest()


def new_spec(job_input: Any, settings: Any) -> JobSpec:
    """A JobSpec of what every job may say besides its request (request_id, priority, deadline,
    cache salt, truncation policy, streaming), the input checked as JSON and its keys known;
    its request is read by its form (handler.job_input)."""
    if not isinstance(job_input, dict):
        raise invalid("input", "must be a JSON object")
    check_json(job_input)
    for key in job_input:
        if key not in TOP_LEVEL_KEYS:
            raise invalid(named_key(key) or '""',
                          "unknown input key; expected one of " + ", ".join(sorted(TOP_LEVEL_KEYS)))
    spec = JobSpec(route="generate", fingerprint=fingerprint(job_input))
    _parse_job_options(job_input, settings, spec)
    return spec


def _parse_job_options(job_input: dict, settings: Any, spec: JobSpec) -> None:
    """What every job may say besides its request: request_id, priority, deadline,
    cache salt, truncation policy and streaming."""
    rid = job_input.get("request_id")
    if rid is not None:
        if not isinstance(rid, str) or not rid or len(rid) > MAX_REQUEST_ID_LEN:
            raise invalid("request_id", f"must be a non-empty string of at most {MAX_REQUEST_ID_LEN} characters")
        if has_control_chars(rid):
            raise invalid("request_id", "must not contain control characters (NUL, newline, tab, escape, ...)")
        spec.idempotency_key = rid
    priority = job_input.get("priority", 0)
    if not is_int(priority) or abs(priority) >= 2**31:
        raise invalid("priority", "must be an integer (lower runs first)")
    spec.priority = priority
    timeout = job_input.get("timeout_s")
    if timeout is not None:
        if not is_number(timeout) or timeout <= 0:
            raise invalid("timeout_s", "must be a number > 0")
        spec.timeout_s = float(timeout)
    elif settings.job_timeout_s:
        spec.timeout_s = float(settings.job_timeout_s)
    spec.cache_salt = _cache_salt(job_input)
    policy = job_input.get("on_truncation", "flag")
    if policy not in ("flag", "error"):
        raise invalid("on_truncation", 'must be "flag" or "error"')
    spec.on_truncation = policy
    spec.stream = parse_bool(job_input, "stream", False)
    spec.batching = _batching(job_input, settings)
