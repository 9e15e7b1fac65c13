"""One engine request run in its own task: the job reads the newest cumulative
output when it is ready, so a slow reader gets text coalesced, never queued."""
from __future__ import annotations

import asyncio
from dataclasses import dataclass


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
    request's failure, `done` the end; `wait` reports news, `close` aborts."""

    def __init__(self, engine, prompt, params, request_id: str, priority: int, cache_salt: str | None):
        self.latest = None
        self.error: BaseException | None = None
        self.done = False
        self._changed = asyncio.Event()
        self._task = asyncio.get_running_loop().create_task(
            self._consume(engine, prompt, params, request_id, priority, cache_salt))

    async def _consume(self, engine, prompt, params, request_id, priority, cache_salt):
        try:
            async for out in engine.generate(prompt, params, request_id=request_id, priority=priority,
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
