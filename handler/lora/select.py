"""Which adapter a job runs with: an OpenAI request's `model` (openai_input.model; body.model in
worker-vllm's route form), a native job's `lora` (an adapter's name) or top-level `model`. With
LoRA on, `model` is an adapter's name or the base model's (the served name, MODEL_NAME) and any
other name fails invalid_input naming the field; with LoRA off `model` is not checked, as before
(OpenAI clients send whatever name they were given). The engine's refusal of an adapter while a
job runs (LoRAError) is the job's invalid_input naming the same field."""
from __future__ import annotations

from typing import Any

from handler.errors import JobError, invalid
from handler.logs import clean
from handler.lora.modules import lora_enabled


SHOWN = 20  # adapter names an error message lists at most


def _served(settings: Any) -> str:
    """What the worker serves, for a refusal's message."""
    from handler.engine_setup import model_label

    names = [m.name for m in settings.lora_modules or ()]
    more = f" and {len(names) - SHOWN} more" if len(names) > SHOWN else ""
    adapters = f" and the LoRA adapters {', '.join(names[:SHOWN])}{more}" if names else \
        " (no LoRA adapters: LORA_MODULES is unset)"
    return f"this worker serves {model_label(settings)!r}{adapters}"


def pick_adapter(name: Any, field: str, settings: Any, *, adapter_only: bool = False) -> str | None:
    """The adapter `name` picks (None: the base model); `adapter_only`: the field names adapters
    only (a native job's `lora`). invalid_input naming `field` for a name that is neither."""
    from handler.engine_setup import base_names

    if name is None or (not adapter_only and not lora_enabled(settings)):  # LoRA off: `model` as before
        return None
    if not isinstance(name, str) or not name:
        raise invalid(field, "must be a non-empty string (a model's or a LoRA adapter's name)")
    if any(m.name == name for m in settings.lora_modules or ()):
        return name
    if adapter_only:
        raise invalid(field, f"no LoRA adapter is named {clean(name, 100)!r}; {_served(settings)}")
    if name in base_names(settings):
        return None
    raise invalid(field, f"unknown model {clean(name, 100)!r}: {_served(settings)}")


def job_adapter(job_input: dict, spec, settings: Any) -> None:
    """Set spec.lora (the adapter's name, None for the base model) and spec.lora_field (the job's
    field that names it) from the job's input, whichever form it came in."""
    if spec.openai_input:
        for key in ("model", "lora"):
            if job_input.get(key) is not None:
                raise invalid(key, "not allowed with openai_route (name the model or adapter in openai_input.model)")
        oi = job_input.get("openai_input")
        name = oi.get("model") if isinstance(oi, dict) and spec.route != "/v1/models" else None
        spec.lora_field = "openai_input.model"
        spec.lora = pick_adapter(name, spec.lora_field, settings)
        return
    if job_input.get("lora") is not None and job_input.get("model") is not None:
        raise invalid("lora", "give only one of lora and model")
    if job_input.get("lora") is not None:
        spec.lora_field = "lora"
        spec.lora = pick_adapter(job_input["lora"], "lora", settings, adapter_only=True)
    else:
        spec.lora_field = "model"
        spec.lora = pick_adapter(job_input.get("model"), "model", settings)


def lora_job_error(spec, exc: BaseException) -> JobError | None:
    """The engine's refusal of the job's adapter (engine.errors.LoRAError, e.g. its files changed
    since the start) as the job's invalid_input naming the job's field, keeping `adapter` and
    `reason`; None for any other error."""
    from engine.errors import LoRAError

    if not isinstance(exc, LoRAError):
        return None
    field = getattr(spec, "lora_field", None) or "lora"
    return JobError("invalid_input", f"{field}: {exc.message}", retryable=False, field=field,
                    adapter=exc.details.get("adapter"), reason=exc.reason)
