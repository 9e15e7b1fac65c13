"""A job's `input` read into a JobSpec, whichever form it takes: worker-vllm's native one
(handler.native.input), the OpenAI one (`openai_route` + `openai_input`: handler.openai),
or worker-vllm's generic `route` + `body` read as the OpenAI one; then the size limits
(handler.job.limits) and what the job may cost (handler.job.costs), and the model or LoRA
adapter it names (handler.lora.select). Every refusal is invalid_input naming the field as the
job sent it."""
from __future__ import annotations

from typing import Any

from handler.errors import JobError, invalid
from handler.job.costs import check_job_cost
from handler.job.limits import check_limits, precheck_counts
from handler.job.schema import ROUTES, JobSpec, new_spec
from handler.lora.select import job_adapter
from handler.native.input import parse_native_request


def parse_job_input(job_input: Any, settings: Any) -> JobSpec:
    """The job's `input` as a JobSpec; raises JobError(invalid_input) naming the field
    (also for input over the size limits of handler.job.limits)."""
    if isinstance(job_input, dict) and "route" in job_input:  # worker-vllm's route + body form
        from handler.openai.route_body import as_openai_form, named_as_body

        try:
            spec = parse_job_input(as_openai_form(job_input, ROUTES), settings)
        except JobError as exc:
            raise named_as_body(exc) from None
        if spec.lora_field is not None:  # an adapter's refusal while the job runs names body.model
            spec.lora_field = spec.lora_field.replace("openai_input", "body", 1)
        return spec
    precheck_counts(job_input, settings)
    spec = new_spec(job_input, settings)
    if job_input.get("openai_route") is not None:
        _openai_request(job_input, spec)
    else:
        parse_native_request(job_input, spec)
    job_adapter(job_input, spec, settings)
    check_limits(spec, job_input, settings)
    check_job_cost(spec, settings)
    return spec


def _openai_request(job_input: dict, spec: JobSpec) -> None:
    """An `openai_route` job's request: the route, and its `openai_input` (no native request beside)."""
    from handler.openai.completions_input import parse_openai_input

    route = job_input["openai_route"]
    if route not in ROUTES:
        raise invalid("openai_route", "must be one of " + ", ".join(ROUTES))
    for key in ("prompt", "messages", "summarize", "sampling_params"):
        if key in job_input:
            raise invalid(key, "not allowed with openai_route (put it in openai_input)")
    spec.route = route
    parse_openai_input(route, job_input.get("openai_input"), spec)
