"""Engine errors, each with a stable code: the failure contract (docs/jobs.md: the table of codes)."""
from __future__ import annotations


class EngineError(Exception):
    """Base class: `code` is stable, `retryable` tells a client whether to retry."""

    code = "engine_error"
    retryable = False

    def __init__(self, message: str, **details):
        super().__init__(message)
        self.message = message
        self.details = details

    def to_dict(self) -> dict:
        return {"code": self.code, "message": self.message, "retryable": self.retryable, **self.details}


class InvalidInputError(EngineError, ValueError):
    code = "invalid_input"

    def __init__(self, message: str, field: str | None = None, **details):
        super().__init__(message, **({"field": field} if field else {}), **details)
        self.field = field


class PromptTooLongError(EngineError):
    code = "prompt_too_long"

    def __init__(self, prompt_tokens: int, max_model_len: int):
        super().__init__(
            f"prompt has {prompt_tokens} tokens; it must be shorter than max_model_len={max_model_len}",
            prompt_tokens=prompt_tokens,
            max_model_len=max_model_len,
        )


class KVCapacityError(EngineError):
    code = "kv_capacity"

    def __init__(self, needed_tokens: int, capacity_tokens: int):
        super().__init__(
            f"request needs {needed_tokens} KV slots but the whole cache holds {capacity_tokens}",
            needed_tokens=needed_tokens,
            capacity_tokens=capacity_tokens,
        )


class OutOfMemoryError(EngineError):
    code = "out_of_memory"
    retryable = True


class EngineDeadError(EngineError):
    code = "engine_dead"
    retryable = True


class ModelLoadError(EngineError):
    code = "model_load_failed"


class UnsupportedModelError(ModelLoadError):
    """Architecture, rope scaling, sliding window or quantization we do not run."""


class RequestFailedError(EngineError):
    """A failure while processing one request (it fails that request only)."""

    code = "internal_error"


class NonFiniteLogitsError(RequestFailedError):
    """The model gave NaN or infinite logits for one request (it fails that request only)."""

    code = "non_finite_logits"


class LoRAError(InvalidInputError):
    """An adapter this engine cannot run (engine.lora): `reason` names why (missing_file,
    bad_config, unsupported, rank_too_large, unknown_module, shape, non_finite, wrong_base,
    id_conflict) and `adapter` which one; the requests naming it fail, nothing else does."""

    def __init__(self, message: str, *, adapter: str, reason: str, field: str = "lora_request"):
        super().__init__(message, field=field, adapter=adapter, reason=reason)
        self.reason = reason
