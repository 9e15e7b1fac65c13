"""What one job may cost the others: its choices (MAX_CHOICES: each is a row of every step it
runs in), its output tokens across its choices (MAX_JOB_TOKENS:
n, or best_of, times max_tokens) and the size of its response, estimated before it runs from
its choices, tokens, logprobs and echo (MAX_RESPONSE_MB). Refusals are invalid_input naming the
field that grows the job; a job without max_tokens gets what fits both instead. A large
response is built in a thread (`build`), so the event loop keeps serving the other jobs."""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

from handler.job.limits import over_limit

TOKEN_BYTES = 16  # a generated token's share of a response: its text, escaped, in JSON
LOGPROB_BYTES = 96  # one logprob entry: {"token", "logprob", "bytes", ...} or {id: {logprob, rank, decoded_token}}
MB = 1024 * 1024
OFF_LOOP_BYTES = 256 * 1024  # a response estimated larger is built off the event loop


def per_token_bytes(params) -> int:
    """Estimated response bytes of one generated token of one choice."""
    top = params.logprobs
    return TOKEN_BYTES + (0 if top is None else (top + 1) * LOGPROB_BYTES)


def fixed_bytes(params, prompt_chars: int, echo: bool) -> int:
    """Estimated response bytes that do not grow with max_tokens: an echoed prompt (per returned
    choice) and the prompt's logprobs (about four characters a token)."""
    out = params.n * prompt_chars * 2 if echo else 0
    if params.prompt_logprobs is not None:
        out += (prompt_chars // 4 + 1) * (params.prompt_logprobs + 1) * LOGPROB_BYTES
    return out


def fitting_max_tokens(params, settings: Any, prompt_chars: int = 0, echo: bool = False) -> int | None:
    """The most max_tokens the job's caps allow at its n, logprobs and echo (None: no cap)."""
    caps = []
    job_tokens = getattr(settings, "max_job_tokens", None)
    if job_tokens:
        caps.append(job_tokens // params.num_choices)
    mb = getattr(settings, "max_response_mb", None)
    if mb:
        room = int(mb * MB) - fixed_bytes(params, prompt_chars, echo)
        caps.append(max(0, room) // (params.n * per_token_bytes(params)))
    return min(caps) if caps else None


def check_job_cost(spec, settings: Any) -> None:
    """MAX_CHOICES, MAX_JOB_TOKENS and MAX_RESPONSE_MB on a parsed job with its max_tokens (or n's cost alone)."""
    params = spec.params
    if params is None:
        return
    prompt_chars = len(spec.prompt) if isinstance(spec.prompt, str) else 0
    choices, asked = params.num_choices, params.max_tokens
    job_tokens = getattr(settings, "max_job_tokens", None)
    grows = spec.field("best_of" if params.best_of else "n") if choices > 1 else spec.field("max_tokens")
    most = getattr(settings, "max_choices", None)
    if most and choices > most:
        raise over_limit(grows, "choices", choices, most, "MAX_CHOICES")
    if job_tokens and asked is not None and choices * asked > job_tokens:
        raise over_limit(grows, f"output tokens ({choices} choices x max_tokens {asked})", choices * asked,
                         job_tokens, "MAX_JOB_TOKENS")
    mb = getattr(settings, "max_response_mb", None)
    if not mb:
        return
    size = fixed_bytes(params, prompt_chars, spec.echo) + params.n * (asked or 1) * per_token_bytes(params)
    if size > mb * MB:
        count = "top_logprobs" if spec.route in ("/v1/chat/completions", "/v1/responses") else "logprobs"
        field = spec.field(count) if params.logprobs else grows
        raise over_limit(field, "bytes of response, estimated (from n, max_tokens, logprobs and echo)", size,
                         int(mb * MB), "MAX_RESPONSE_MB")


def finished_bytes(params, comp) -> int:
    """Estimated response bytes of a finished request (its tokens, with their logprobs)."""
    prompt = comp.prompt_tokens * (params.prompt_logprobs + 1) * LOGPROB_BYTES if params.prompt_logprobs else 0
    return comp.completion_tokens * per_token_bytes(params) + prompt


async def build(fn: Callable[[], Any], estimated_bytes: int) -> Any:
    """fn(), in a thread when its output is estimated past OFF_LOOP_BYTES."""
    if estimated_bytes <= OFF_LOOP_BYTES:
        return fn()
    return await asyncio.to_thread(fn)
