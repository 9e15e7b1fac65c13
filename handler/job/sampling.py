"""A job's sampling values: the names a job may give (engine.SamplingParams'
request fields, vLLM's older `guided_decoding` for structured_outputs, and vLLM's
names we take only at their no-op value), checked by the engine's own rules (every
field's type too), its errors named by the job's fields as the job sent them."""
from __future__ import annotations

from typing import Any

from engine.sampling_params import REQUEST_FIELDS
from handler.errors import JobError, invalid

# vLLM names we accept only at their no-op value (n, best_of, logprobs, prompt_logprobs: engine fields)
SAMPLING_NOOP = {"use_beam_search": False}
# engine.SamplingParams fields a job may set; max_tokens may stay unset (the worker resolves it)
SAMPLING_KEYS = frozenset(REQUEST_FIELDS) - set(SAMPLING_NOOP)
STRUCTURED = ("structured_outputs", "guided_decoding")  # vLLM's names of one field, newer and older


def is_noop(value: Any, allowed: tuple) -> bool:
    """`value` is one of the `allowed` values, of the same type: true is not 1, 1.0 is not 1, 0 is not false."""
    return any(type(value) is type(a) and value == a for a in allowed)


def invalid_from_engine(spec, exc, sent_as: dict[str, str] | None = None) -> JobError:
    """An engine InvalidInputError as the job's invalid_input, naming the job's field
    (`spec.field`: handler.job.schema.JobSpec.field) under the name the job used (`sent_as`:
    engine name -> the job's, e.g. max_tokens -> max_completion_tokens)."""
    problem = exc.message.removeprefix("sampling params: ").removeprefix(f"{exc.field}: ")
    problem = problem.removeprefix(f"{exc.field} ")
    name = (sent_as or {}).get(exc.field, exc.field)
    return invalid(spec.field(name), problem)


def _structured(key: str, value: Any, spec, out: dict) -> None:
    """sampling_params' structured_outputs or guided_decoding, one of them (`backend` checked
    and dropped: handler.job.structured.spec_object); refusals name the one the job gave."""
    from handler.job.structured import spec_object

    if value is None:
        return
    where = f"{spec.field(None)}.{key}"  # as sent (spec.field would rename structured_outputs)
    if "structured_outputs" in out:
        raise invalid(where, f"give only one of {', '.join(STRUCTURED)}")
    out["structured_outputs"] = spec_object(value, where)
    if key != "structured_outputs":
        spec.renamed["structured_outputs"] = key


def check_sampling(values: Any, spec, sent_as: dict[str, str] | None = None) -> tuple[dict, Any]:
    """(the given sampling values, None ones dropped; the engine's SamplingParams of them), built
    now by the engine's rules so a bad value fails before the model loads, and built once: the
    job's request runs with these params. `sent_as` maps an engine name to the one the job gave
    (OpenAI's max_completion_tokens)."""
    from engine.errors import InvalidInputError
    from engine.input_processor import sampling_params

    if values is None:
        return {}, sampling_params(None)
    if not isinstance(values, dict):
        raise invalid(spec.field(None), "must be an object")
    out = {}
    for key, value in values.items():
        if key in STRUCTURED:
            _structured(key, value, spec, out)
            continue
        if key in SAMPLING_NOOP:
            if value is not None and not is_noop(value, (SAMPLING_NOOP[key],)):
                raise invalid(spec.field(key), f"only {SAMPLING_NOOP[key]!r} is supported")
            continue
        if key not in SAMPLING_KEYS:
            raise invalid(spec.field(key), "unknown sampling parameter; supported: " + ", ".join(sorted(SAMPLING_KEYS)))
        if value is not None:
            out[key] = value
    try:
        return out, sampling_params(out)
    except InvalidInputError as exc:
        raise invalid_from_engine(spec, exc, sent_as) from None
