"""worker-vllm's generic proxy job form, `{"route": "/v1/...", "method": "POST", "body": {...}}`
(its newer handler), read as the `openai_route` + `openai_input` form; refusals name `body.<field>`."""
from __future__ import annotations

from handler.errors import JobError, invalid

METHODS = {"/v1/models": "GET"}  # the others are POST routes


def as_openai_form(job_input: dict, routes: tuple[str, ...]) -> dict:
    """The job's input with route/method/body turned into openai_route/openai_input."""
    route, method, body = job_input.get("route"), job_input.get("method"), job_input.get("body")
    if "openai_route" in job_input or "openai_input" in job_input:
        raise invalid("route", "give either route + body or openai_route + openai_input")
    if route not in routes:
        raise invalid("route", "must be one of " + ", ".join(routes))
    want = METHODS.get(route, "POST")
    if method is not None and (not isinstance(method, str) or method.upper() != want):
        raise invalid("method", f"{route} takes {want}")
    out = {k: v for k, v in job_input.items() if k not in ("route", "method", "body")}
    out["openai_route"] = route
    if body is not None:
        out["openai_input"] = body
    return out


def named_as_body(exc: JobError) -> JobError:
    """A refusal of the converted input, naming the field as the job sent it (body.<field>)."""
    field = exc.details.get("field")
    if exc.code != "invalid_input" or not isinstance(field, str):
        return exc
    for old, new in (("openai_input", "body"), ("openai_route", "route")):
        if field == old or field.startswith(old + ".") or field.startswith(old + "["):
            renamed = new + field[len(old):]
            message = exc.message.replace(field, renamed, 1) if exc.message.startswith(field) else exc.message
            return JobError(exc.code, message, retryable=exc.retryable, **{**exc.details, "field": renamed})
    return exc
