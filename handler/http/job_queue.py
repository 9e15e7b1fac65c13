"""The endpoint's job queue: jobs start in order, as many at once as the worker's
concurrency modifier allows, resized the way the runpod SDK's JobScaler does (it starts
at 1 and takes a new value only when no job is in flight), each run to its end by the SDK's rules
(handler.local.drive); /cancel takes a job out of the queue or cancels its running task."""
from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable

from handler.http.jobs import CANCELLED, Job, JobStore
from handler.local import drive

log = logging.getLogger("handler.http")

POLL_S = 0.1  # while jobs wait for a slot: how often the concurrency modifier is asked again


class JobQueue:
    """Runs `store`'s submitted jobs on `handler` (the worker's async-generator handler)."""

    def __init__(self, store: JobStore, handler, concurrency_modifier: Callable[[int], int] | None = None):
        self.store = store
        self.handler = handler
        self.modifier = concurrency_modifier or (lambda current: current)
        self.concurrency = 1  # the SDK's JobScaler starts at 1
        self.waiting: deque[Job] = deque()
        self.tasks: dict[str, asyncio.Task] = {}
        self._wake = asyncio.Event()
        self._loop_task: asyncio.Task | None = None

    @property
    def running(self) -> int:
        return len(self.tasks)

    def start(self) -> None:
        """Start taking jobs (on the running event loop)."""
        self._loop_task = asyncio.get_running_loop().create_task(self._run())

    async def close(self) -> None:
        """Stop: queued jobs stay IN_QUEUE, running ones are cancelled."""
        tasks = [t for t in (self._loop_task, *self.tasks.values()) if t is not None]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def submit(self, job: Job) -> None:
        self.waiting.append(job)
        self._wake.set()

    def cancel(self, job: Job) -> None:
        """POST /cancel: CANCELLED at once; a queued job never starts, a running one's task is cancelled
        (the handler aborts its engine request and frees its KV blocks)."""
        self.store.end(job, CANCELLED)
        if job in self.waiting:
            self.waiting.remove(job)
        task = self.tasks.get(job.id)
        if task is not None:
            task.cancel()

    async def execute(self, job: Job) -> None:
        """One job's run (the tests' fake picks another worker for some jobs here)."""
        await run_stored_job(self.handler, job, self.store)

    async def _run(self) -> None:
        while True:
            self._start_ready()
            try:
                await asyncio.wait_for(self._wake.wait(), POLL_S if self.waiting else None)
            except TimeoutError:
                pass
            self._wake.clear()

    def _start_ready(self) -> None:
        if not self.waiting:
            return
        try:
            wanted = max(0, int(self.modifier(self.concurrency)))
        except Exception:  # noqa: BLE001 - as the SDK's loop: log it, keep the concurrency it had
            log.exception("the concurrency modifier failed; keeping %d", self.concurrency)
            wanted = self.concurrency
        if wanted != self.concurrency:
            if self.tasks:
                return  # the SDK resizes only with no job in flight, and takes none meanwhile
            log.debug("concurrency %d -> %d", self.concurrency, wanted)
            self.concurrency = wanted
        while self.waiting and len(self.tasks) < self.concurrency:
            job = self.waiting.popleft()
            task = asyncio.get_running_loop().create_task(self.execute(job))
            self.tasks[job.id] = task
            task.add_done_callback(lambda t, jid=job.id: self._done(jid, t))

    def _done(self, jid: str, task: asyncio.Task) -> None:
        self.tasks.pop(jid, None)
        if not task.cancelled() and task.exception() is not None:
            log.error("[job %s] its run ended with %r", jid, task.exception())
        self._wake.set()


async def run_stored_job(handler, job: Job, store: JobStore, worker: str | None = None) -> None:
    """Run a queued job on `handler`, its state kept in `store`. Cancelled (POST /cancel):
    the handler's task is cancelled and the job stays CANCELLED, as RunPod marks it."""
    if not store.start(job, worker):
        return
    try:
        result = await drive(handler, {"id": job.id, "input": job.input}, lambda item: store.add(job, item))
    except asyncio.CancelledError:
        store.end(job, CANCELLED)
        raise
    store.end(job, result["status"], output=result.get("output"), error=result.get("error"))
