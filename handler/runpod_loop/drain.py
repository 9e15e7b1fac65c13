"""The worker's drain, between the SDK's job loop and the handler: the loop starts it (SIGTERM,
or a refresh after engine_dead) and ends it at DRAIN_TIMEOUT_S; the handler registers each
running job with it, so that at the deadline each one's engine requests are aborted and it
fails `worker_shutdown` (retryable) with its partial text, and no job starts after it."""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from handler.errors import JobError

log = logging.getLogger("handler.runpod_loop")


class JobDrain:
    """One running job as the drain sees it: its live engine request ids, and `expired`,
    set when the drain's deadline ended it."""

    def __init__(self):
        self.requests: set[str] = set()
        self.expired = asyncio.Event()


class Drain:
    """The shutdown state: `begin` once the worker stops taking jobs, `expire` at the deadline.
    `abort(request_id)` is the engine's abort (the request ends with finish_reason "abort"
    and the text so far, which the job turns into its worker_shutdown failure)."""

    def __init__(self, timeout_s: float, abort: Callable[[str], Awaitable[None]]):
        self.timeout_s = timeout_s
        self.reason: str | None = None  # why the worker stops; None while it serves
        self.started: float | None = None
        self.expired = False
        self._abort = abort
        self._jobs: set[JobDrain] = set()

    @property
    def deadline(self) -> float | None:
        """When the jobs still running fail (monotonic seconds); None while serving."""
        return None if self.started is None else self.started + self.timeout_s

    @property
    def running(self) -> int:
        return len(self._jobs)

    def begin(self, reason: str) -> bool:
        """The worker stops taking jobs (`reason`: "SIGTERM", ...); True the first time only."""
        if self.started is not None:
            return False
        self.reason, self.started = reason, time.monotonic()
        return True

    def enter(self) -> JobDrain:
        job = JobDrain()
        self._jobs.add(job)
        return job

    def leave(self, job: JobDrain) -> None:
        self._jobs.discard(job)

    async def expire(self) -> int:
        """The deadline passed: every running job is ended (its engine requests aborted) and
        none starts any more. Returns how many jobs were running."""
        self.expired = True
        jobs = list(self._jobs)
        for job in jobs:
            job.expired.set()
        for job in jobs:
            for request_id in list(job.requests):
                await self._abort(request_id)
        return len(jobs)

    def ended(self, error: JobError, job: JobDrain) -> JobError:
        """A job's failure as reported: the abort the deadline caused becomes worker_shutdown,
        with the text the job had produced."""
        if not job.expired.is_set() or error.code != "cancelled":
            return error
        return self.shutdown_error(running=True).with_partial_text(error.details.get("partial_text"))

    def shutdown_error(self, running: bool) -> JobError:
        """worker_shutdown for a job still running at the deadline, or one that came after it."""
        when = ("the job was still running when its drain deadline" if running
                else "its drain deadline")
        after = "" if running else " before the job could start"
        return JobError("worker_shutdown", f"the worker is shutting down ({self.reason or 'stopping'}) and {when} "
                        f"(DRAIN_TIMEOUT_S={self.timeout_s:g}s) passed{after}; resubmit the job", retryable=True,
                        drain_timeout_s=self.timeout_s)


class JobEngine:
    """The engine as one job uses it: the same object, except that `generate` records the
    job's live request ids (for the drain's aborts) and refuses new requests after the deadline."""

    def __init__(self, engine, drain: Drain, job: JobDrain):
        self._engine, self._drain, self._job = engine, drain, job

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    async def unless_expired(self, awaitable: Awaitable):
        """`awaitable`'s result, unless the drain's deadline ends the job first (worker_shutdown)."""
        return await unless_expired(self._job, self._drain, awaitable)

    async def generate(self, prompt, params=None, request_id: str = "", **kwargs):
        if self._drain.expired:
            raise self._drain.shutdown_error(running=True)
        self._job.requests.add(request_id)
        try:
            async for out in self._engine.generate(prompt, params, request_id=request_id, **kwargs):
                yield out
        finally:
            self._job.requests.discard(request_id)


async def unless_expired(job: JobDrain, drain: Drain, awaitable: Awaitable):
    """`awaitable`'s result, unless the drain's deadline ends the job first (worker_shutdown)."""
    task = asyncio.ensure_future(awaitable)
    expired = asyncio.ensure_future(job.expired.wait())
    try:
        done, _ = await asyncio.wait({task, expired}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        expired.cancel()
        if not task.done():
            task.cancel()  # the deadline came first, or we ourselves are being cancelled
    if task in done:
        return task.result()
    raise drain.shutdown_error(running=True)
