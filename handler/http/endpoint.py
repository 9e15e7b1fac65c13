"""One endpoint's jobs as the HTTP routes use them: `JobEndpoint`, what every endpoint gives the
routes (its worker and job store, waits for a job's end or its next item), and `LocalEndpoint`,
the local endpoint's, which runs the jobs through its job queue (submit, cancel, health)."""
from __future__ import annotations

import asyncio
import time
from typing import Any

from handler.http.job_queue import JobQueue
from handler.http.jobs import FINAL, Job, JobStore


class JobEndpoint:
    """A worker (a handler `Worker`) and its jobs; subclasses say how a job is submitted
    (`submit(job_input, sync=, size=)`) and cancelled (`cancel(job)`)."""

    def __init__(self, worker, store: JobStore):
        self.worker = worker
        self.store = store

    async def wait_final(self, job: Job, timeout: float | None = None) -> bool:
        """Wait until the job ended (True), or `timeout` seconds passed (False)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while job.status not in FINAL:
            if not await self.wait_change(job, None if deadline is None else deadline - time.monotonic()):
                return job.status in FINAL
        return True

    @staticmethod
    async def wait_change(job: Job, timeout: float | None = None) -> bool:
        """Wait for the job's next change (an item, its end); False when `timeout` passed first."""
        if job.status in FINAL:
            return True
        event = job.changed()
        try:
            await asyncio.wait_for(event.wait(), None if timeout is None else max(0.0, timeout))
        except TimeoutError:
            return False
        return True


class LocalEndpoint(JobEndpoint):
    """RunPod's side of one endpoint with a single worker (a handler `Worker`)."""

    def __init__(self, worker, store: JobStore | None = None):
        super().__init__(worker, store or JobStore.for_settings(worker.settings))
        self.queue = JobQueue(self.store, worker.handle, worker.concurrency_modifier)

    async def start(self) -> None:
        self.queue.start()

    async def close(self) -> None:
        await self.queue.close()
        await self.worker.aclose()

    def submit(self, job_input: Any, *, sync: bool = False, size: int = 0) -> Job:
        """A new job (`size`: its body's bytes); handler.http.jobs.StoreFull past the endpoint's bounds."""
        job = self.store.new(job_input, sync=sync, size=size)
        self.queue.submit(job)
        return job

    def get(self, job_id: str) -> Job | None:
        return self.store.get(job_id)

    def cancel(self, job: Job) -> dict:
        self.queue.cancel(job)
        return {"id": job.id, "status": job.status}

    def health(self) -> dict:
        return self.store.health(unhealthy=getattr(self.worker, "dead", None) is not None)
