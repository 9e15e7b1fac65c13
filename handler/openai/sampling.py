"""OpenAI's sampling-output fields into engine values, each refusal naming openai_input.<field>:
chat `logprobs` (bool) + `top_logprobs` (0..20), completions `logprobs` (int) and `echo` (the
prompt's text, and with logprobs its prompt_logprobs, as vLLM), `n`, `best_of`, `logit_bias`
(token id strings -> bias, checked by engine.SamplingParams)."""
from __future__ import annotations

from typing import Any

from engine.validation import is_int
from handler.errors import invalid

CHAT_TOP_LOGPROBS = 20  # OpenAI's limit (MAX_LOGPROBS may lower it)
CHAT_KEYS = frozenset({"logprobs", "top_logprobs", "n", "best_of", "logit_bias"})
COMPLETION_KEYS = frozenset({"logprobs", "echo", "n", "best_of", "logit_bias"})


def output_keys(route: str) -> frozenset[str]:
    """The openai_input fields parse_output_fields reads for a route."""
    return CHAT_KEYS if route == "/v1/chat/completions" else COMPLETION_KEYS


def _chat_logprobs(oi: dict, p: str) -> int | None:
    lp, top = oi.get("logprobs"), oi.get("top_logprobs")
    if lp is not None and not isinstance(lp, bool):
        raise invalid(p + "logprobs", "must be true or false")
    if top is not None:
        if not is_int(top) or not 0 <= top <= CHAT_TOP_LOGPROBS:
            raise invalid(p + "top_logprobs", f"must be an integer in [0, {CHAT_TOP_LOGPROBS}]")
        if top and not lp:
            raise invalid(p + "top_logprobs", "needs logprobs: true")
    return (top or 0) if lp else None


def parse_output_fields(route: str, oi: dict, spec: Any, p: str) -> dict:
    """The engine sampling values of these fields (spec.echo set for completions)."""
    out: dict = {}
    if route == "/v1/chat/completions":
        logprobs = _chat_logprobs(oi, p)
    else:
        logprobs = oi.get("logprobs")
        if logprobs is not None and (not is_int(logprobs) or logprobs < 0):
            raise invalid(p + "logprobs", "must be an integer >= 0 (the top logprobs per token)")
        echo = oi.get("echo")
        if echo is not None and not isinstance(echo, bool):
            raise invalid(p + "echo", "must be true or false")
        spec.echo = bool(echo)
        if echo and logprobs is not None:
            out["prompt_logprobs"] = logprobs
    if logprobs is not None:
        out["logprobs"] = logprobs
    for key in ("n", "best_of", "logit_bias"):
        if oi.get(key) is not None:
            out[key] = oi[key]
    best_of, n = out.get("best_of"), out.get("n", 1)
    if spec.stream and best_of is not None and best_of != n:
        raise invalid(p + "best_of", "must equal n when streaming (the best choices are known at the end only)")
    return out
