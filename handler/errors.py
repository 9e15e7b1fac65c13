"""Job errors of the failure contract and their one wire shape: a stream item
`{"error": "<JSON string>"}` that the runpod SDK passes through to /status unchanged."""
from __future__ import annotations

import json
from typing import Any

# Codes the handler itself decides (the engine's own come from engine.errors).
# worker_shutdown: the worker is draining (SIGTERM, refresh) and cannot run or finish the
# job in time (handler.runpod_loop.drain); another worker can.
RETRYABLE = {"out_of_memory", "engine_dead", "overloaded", "timeout", "worker_shutdown"}


class JobError(Exception):
    """A job's failure: a stable `code`, a `message`, `retryable`, and details
    (e.g. `field`, `partial_text`) that go into the error object as keys."""

    def __init__(self, code: str, message: str, *, retryable: bool | None = None, **details: Any):
        super().__init__(message)
        self.code = code
        self.message = message
        self.retryable = code in RETRYABLE if retryable is None else retryable
        self.details = {k: v for k, v in details.items() if v is not None}

    def to_dict(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "retryable": self.retryable, **self.details}

    def with_partial_text(self, text: str | None) -> JobError:
        """Attach the text produced so far (kept only when there is some)."""
        if text and "partial_text" not in self.details:
            self.details["partial_text"] = text
        return self

    @classmethod
    def from_exception(cls, exc: BaseException) -> JobError:
        """Map an engine error (anything with code/message/retryable/details) or an
        unexpected exception onto a JobError."""
        if isinstance(exc, JobError):
            return exc
        code = getattr(exc, "code", None)
        if isinstance(code, str) and hasattr(exc, "retryable"):
            details = dict(getattr(exc, "details", None) or {})
            return cls(code, getattr(exc, "message", None) or str(exc), retryable=bool(exc.retryable), **details)
        return cls("internal_error", f"{type(exc).__name__}: {exc}", retryable=False)


def invalid(field: str, message: str) -> JobError:
    return JobError("invalid_input", f"{field}: {message}", field=field)


def error_item(err: JobError) -> dict[str, str]:
    """The stream item that fails the job: the SDK turns the value into str(),
    so it is already a JSON string and /status parses as JSON with `code`."""
    return {"error": json.dumps(err.to_dict(), ensure_ascii=False)}
