"""How a job runs its engine requests: the prompt and sampling values through
the engine's input processor (its coded errors named by the job's fields), the
event loop over the engine's stream (deadline, queue timeout, partial text),
and the failure contract's check on the finished request."""
from __future__ import annotations

import asyncio
import math
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

from handler.errors import JobError
from handler.job.sampling import invalid_from_engine
from handler.job.schema import JobSpec


@dataclass(slots=True)
class Completion:
    """A finished request, as the job reports it."""

    text: str
    finish_reason: str | None
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    metrics: dict


class RequestStream:
    """`engine.generate` consumed by a task: `latest` is the newest output, `error` the
    request's failure, `done` the end; `wait` reports news, `close` aborts. A slow
    reader gets text coalesced, never queued."""

    def __init__(self, engine, request, request_id: str, priority: int, cache_salt: str | None):
        self.latest = None
        self.error: BaseException | None = None
        self.done = False
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._consume(engine, request, request_id, priority, cache_salt))

    async def _consume(self, engine, request, request_id, priority, cache_salt):
        try:
            async for out in engine.generate(request, None, request_id=request_id, priority=priority,
                                             cache_salt=cache_salt):
                self.latest = out
                self._changed.set()
        except Exception as exc:  # noqa: BLE001 - handed to the job, which reports it
            self.error = exc
        finally:
            self.done = True
            self._changed.set()

    async def wait(self, timeout: float | None) -> bool:
        """Wait for news (new output, an error, the end); False when `timeout` passed first."""
        if not self._changed.is_set():
            try:
                await asyncio.wait_for(self._changed.wait(), timeout)
            except TimeoutError:
                return False
        self._changed.clear()
        return True

    async def close(self) -> None:
        """Abort the request if it still runs (the engine frees its KV blocks)."""
        if not self._task.done():
            self._task.cancel()
        try:
            await self._task
        except asyncio.CancelledError:
            if not self._task.cancelled():
                raise  # we ourselves are being cancelled


def job_prompt(spec: JobSpec):
    """The job's prompt as the engine's input processor takes it."""
    if spec.messages is not None:
        return {"messages": spec.messages}
    if isinstance(spec.prompt, list):
        return {"prompt_token_ids": spec.prompt}
    return spec.prompt


class JobRequests:
    """One job's engine requests: `prepare` a prompt with sampling values, run it with
    `events`, `check` the result against the failure contract."""

    def __init__(self, ctx, engine, spec: JobSpec, settings: Any):
        self.ctx, self.engine, self.spec, self.settings = ctx, engine, spec, settings

    def prepare(self, prompt, sampling: dict):
        """The engine request: a missing max_tokens is what fits the context (and the KV
        cache), capped at DEFAULT_MAX_TOKENS (and MAX_OUTPUT_TOKENS): never vLLM's 16."""
        from engine.errors import EngineError, InvalidInputError

        cap = getattr(self.settings, "max_output_tokens", None) or math.inf
        default = int(min(self.settings.default_max_tokens, cap))
        try:
            return self.engine.input_processor.process(prompt, sampling, default_max_tokens=default)
        except InvalidInputError as exc:
            raise invalid_from_engine(self.spec, exc) from None
        except EngineError as exc:  # prompt_too_long, kv_capacity: the engine's codes and numbers
            raise JobError.from_exception(exc) from None

    def count_tokens(self, prompt) -> int:
        """Tokens of a prompt as prepare would encode it."""
        return len(self.engine.input_processor.encode(prompt)[1])

    async def events(self, request, engine_request_id: str) -> AsyncIterator[tuple[str, Any, int]]:
        """Run one request: ("delta", text, new_tokens) events, then ("done", Completion, 0).
        Raises JobError on failure, timeout or queue timeout, with the text so far."""
        engine, ctx = self.engine, self.ctx
        if engine.is_dead:
            raise JobError("engine_dead", "the engine is dead; this worker is being replaced")
        submitted = time.monotonic()
        ctx.arrival = ctx.arrival or submitted
        stream = RequestStream(engine, request, engine_request_id, self.spec.priority, self.spec.cache_salt)
        text, ntok, out = "", 0, None
        started = False  # the engine has run a step of it: no longer queued
        try:
            while True:
                if not await stream.wait(self._wait_limit(submitted, queued=out is None and not started)):
                    self._raise_deadline(text)
                    if not engine.is_queued(engine_request_id):
                        started = True  # a long prefill, not a queue: wait for its tokens
                        continue
                    raise JobError("overloaded", f"still queued in the engine QUEUE_TIMEOUT_S="
                                   f"{self.settings.queue_timeout_s:g}s after reaching it", retryable=True)
                # snapshot first: the stream moves on while we are suspended at the yield below
                latest, error, done = stream.latest, stream.error, stream.done
                if latest is not None and latest is not out:
                    if out is None:
                        ctx.prompt_tokens += len(latest.prompt_token_ids)
                        ctx.cached_tokens += latest.num_cached_tokens or 0
                    out = latest
                    comp = out.outputs[0]
                    new_text, new_tok = comp.text[len(text):], len(comp.token_ids) - ntok
                    ctx.add_tokens(new_tok)
                    text, ntok = comp.text, len(comp.token_ids)
                    if new_text or new_tok:
                        yield "delta", new_text, new_tok
                if error is not None:
                    err = JobError.from_exception(error)
                    engine_text = err.details.pop("partial_text", None) or ""
                    raise err.with_partial_text(max(text, engine_text, key=len))
                if done:
                    break
        finally:
            await stream.close()
        if out is None:
            raise JobError("internal_error", "the engine ended the request without any output")
        comp = out.outputs[0]
        yield "done", Completion(text, comp.finish_reason, len(out.prompt_token_ids), ntok, out.num_cached_tokens,
                                 dict(out.metrics or {})), 0

    def _wait_limit(self, submitted: float, queued: bool) -> float | None:
        """Seconds to wait for news: until the job's deadline, or the queue timeout while queued."""
        now = time.monotonic()
        limits = []
        if self.ctx.deadline is not None:
            limits.append(self.ctx.deadline - now)
        if self.settings.queue_timeout_s and queued:
            limits.append(submitted + self.settings.queue_timeout_s - now)
        return max(0.0, min(limits)) if limits else None

    def _raise_deadline(self, text: str) -> None:
        if self.ctx.deadline is not None and time.monotonic() >= self.ctx.deadline:
            raise JobError("timeout", f"the job's deadline of {self.spec.timeout_s:g}s passed",
                           timeout_s=self.spec.timeout_s).with_partial_text(text)

    def check(self, comp: Completion) -> None:
        """The failure contract on a finished request: never success with empty or
        (when asked) truncated text."""
        if comp.finish_reason is None:
            raise JobError("internal_error", "the request ended without a finish reason").with_partial_text(comp.text)
        if comp.finish_reason == "abort":
            raise JobError("cancelled", "the request was aborted").with_partial_text(comp.text)
        usage = {"prompt_tokens": comp.prompt_tokens, "completion_tokens": comp.completion_tokens}
        if not comp.text.strip():
            raise JobError("empty_output", f"the model produced {comp.completion_tokens} tokens but no text "
                           f"(finish_reason {comp.finish_reason})", finish_reason=comp.finish_reason,
                           usage=usage).with_partial_text(comp.text)
        if comp.finish_reason == "length" and self.spec.on_truncation == "error":
            raise JobError("truncated", f"the output reached its limit of {comp.completion_tokens} tokens "
                           "(on_truncation: error)", finish_reason="length", usage=usage).with_partial_text(comp.text)
