"""The runpod SDK's job loop (`rp_scale.JobScaler`, written against runpod 1.12) with the
worker's edges: job takes parsed job by job (handler.runpod_loop.job_take); on SIGTERM (or when the
SDK stops the worker after a job with refresh_worker) no new take starts, jobs that a take
still in flight returns run within the drain, and the drain ends at DRAIN_TIMEOUT_S: the jobs
still running then fail `worker_shutdown` with their partial text, nothing is killed silently."""
from __future__ import annotations

import asyncio
import json
import logging
import signal
import time

from runpod.http_client import AsyncClientSession
from runpod.serverless.modules import rp_scale
from runpod.serverless.modules.rp_http import send_result

from handler.runpod_loop.drain import Drain
from handler.runpod_loop.job_take import take_jobs

log = logging.getLogger("handler.runpod_loop")

DRAIN_KEY = "worker_drain"  # the config key that carries the worker's Drain to the loop
GRACE_S = 0.5  # after the deadline: time for the aborted jobs to post their failures themselves
SDK_VERSION = "1.12."  # the SDK whose JobScaler this subclass was written against


class WorkerScaler(rp_scale.JobScaler):
    """The SDK's JobScaler; `get_jobs`, `set_scale`, `handle_job` and the stop channel are the
    SDK's own, the take, the signal, the run loop and the drain are ours."""

    def __init__(self, config: dict):
        super().__init__(config)
        self.drain: Drain = config[DRAIN_KEY]
        self.jobs_fetcher = self._take  # in every mode: the SDK lets config replace it only in local tests
        self._take_task: asyncio.Task | None = None
        self._takes_in_flight = 0  # take requests not yet answered
        self._handed_over = 0  # jobs a take returned that the run loop has not started yet
        self._task_jobs: dict[asyncio.Task, dict] = {}

    # -- stopping -------------------------------------------------------------------------
    def handle_shutdown(self, signum, frame):
        """SIGTERM / SIGINT (installed by the SDK's `start`)."""
        self._stop(signal.Signals(signum).name)

    def kill_worker(self):
        """What the SDK's handle_job calls after a job when refresh_worker is set."""
        self._stop("refresh_worker: this worker is being replaced")

    def _stop(self, reason: str) -> None:
        if self.drain.begin(reason):
            log.info("%s: no new job takes; %d jobs running, %d queued, %d take(s) in flight; the drain ends "
                     "in DRAIN_TIMEOUT_S=%gs", reason, len(self._task_jobs), self.jobs_queue.qsize(),
                     self._takes_in_flight, self.drain.timeout_s)
        super().kill_worker()

    def _taking(self) -> bool:
        """A take is in flight, or returned jobs the run loop has not started yet."""
        return self._takes_in_flight > 0 or self._handed_over > 0

    async def _take(self, session, num_jobs: int):
        if not self.is_alive():
            return None  # stopped between the SDK's check and this take: take nothing more
        self._takes_in_flight += 1
        try:
            jobs = await take_jobs(session, num_jobs)
        finally:
            self._takes_in_flight -= 1
        self._handed_over += len(jobs or ())  # counted until started, so the drain waits for them
        if jobs and not self.is_alive():
            log.info("a job take in flight when the worker stopped returned %d job(s): they run within the drain",
                     len(jobs))
        return jobs

    # -- the loop -------------------------------------------------------------------------
    async def run(self):
        async with AsyncClientSession() as session:
            self._take_task = asyncio.create_task(self.get_jobs(session))
            stop_task = asyncio.create_task(self.monitor_stop_signals(session))
            try:
                await self.run_jobs(session)
            finally:
                for task in (self._take_task, stop_task):  # their long-polls have nothing left to do
                    task.cancel()
                await asyncio.gather(self._take_task, stop_task, return_exceptions=True)

    async def run_jobs(self, session):
        """Start queued jobs up to the concurrency; after the stop, go on while jobs run, are
        queued or a take is in flight, until the drain's deadline."""
        tasks: set[asyncio.Task] = set()
        while self.is_alive() or tasks or not self.jobs_queue.empty() or self._taking():
            self._start_jobs(session, tasks)
            if tasks:
                done, _ = await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED, timeout=0.1)
                self._reap(tasks, done)
            else:
                await asyncio.sleep(0.1)
            deadline = self.drain.deadline
            if deadline is not None and time.monotonic() >= deadline:
                await self._expire(session, tasks)
                return
        if self.drain.started is not None:
            log.info("drained %.1fs after the stop (%s)", time.monotonic() - self.drain.started, self.drain.reason)

    def _start_jobs(self, session, tasks: set[asyncio.Task]) -> None:
        # after the deadline every queued job starts: the handler refuses it worker_shutdown at once
        while (len(tasks) < self.current_concurrency or self.drain.expired) and not self.jobs_queue.empty():
            job = self.jobs_queue.get_nowait()
            self._handed_over = max(0, self._handed_over - 1)
            task = asyncio.create_task(self.handle_job(session, job))
            tasks.add(task)
            self.jobs_tasks[job["id"]] = task
            self._task_jobs[task] = job

    def _reap(self, tasks: set[asyncio.Task], done: set[asyncio.Task]) -> None:
        for task in done:
            tasks.discard(task)
            job = self._task_jobs.pop(task, {})
            if not task.cancelled() and task.exception() is not None:  # the SDK logged it already
                log.debug("job %s: its task ended with %r", job.get("id"), task.exception())

    async def _expire(self, session, tasks: set[asyncio.Task]) -> None:
        """The deadline: the running jobs are aborted (each fails worker_shutdown with its text),
        the queued ones start and are refused; a job that still has not ended after GRACE_S is
        cancelled and its worker_shutdown failure posted here."""
        log.warning("drain deadline: DRAIN_TIMEOUT_S=%gs passed (%s) with %d job(s) running and %d queued: they "
                    "fail worker_shutdown (retryable)", self.drain.timeout_s, self.drain.reason, len(tasks),
                    self.jobs_queue.qsize())
        grace_end = time.monotonic() + GRACE_S
        try:  # bounded: an abort waits for the engine's current step
            await asyncio.wait_for(self.drain.expire(), GRACE_S)
        except asyncio.TimeoutError:
            log.warning("drain deadline: the engine did not take the aborts within %gs", GRACE_S)
        self._start_jobs(session, tasks)
        if self._takes_in_flight and self._take_task is not None:
            log.info("a job take was still in flight at the drain deadline: cancelled")
            self._take_task.cancel()
        wait = max(0.0, grace_end - time.monotonic())
        if tasks and wait:
            await asyncio.wait(tasks, timeout=wait)
        self._reap(tasks, {t for t in tasks if t.done()})
        if not tasks:
            return
        stuck = set(tasks)
        for task in stuck:
            task.cancel()
        await asyncio.wait(stuck, timeout=0.1)
        error = {"error": json.dumps(self.drain.shutdown_error(running=True).to_dict(), ensure_ascii=False)}
        for task in stuck:
            job = self._task_jobs.pop(task, None)
            if job is None or (task.done() and not task.cancelled()):
                continue  # it ended on its own after all, its result posted
            log.warning("[job %s] did not end %gs after the drain deadline: cancelled, worker_shutdown posted",
                        job["id"], GRACE_S)
            await send_result(session, dict(error), job, is_stream=True)


def start(config: dict, drain: Drain) -> None:
    """runpod.serverless.start(config) with WorkerScaler as the SDK's job loop (the SDK's
    run_worker builds `rp_scale.JobScaler(config)`; it is ours for the length of the call)."""
    import runpod
    from runpod.version import __version__

    if not __version__.startswith(SDK_VERSION):
        log.warning("runpod %s: handler.runpod_loop.scaler was written against runpod %sx; check its overrides",
                    __version__, SDK_VERSION)
    config[DRAIN_KEY] = drain
    original = rp_scale.JobScaler
    rp_scale.JobScaler = WorkerScaler
    try:
        runpod.serverless.start(config)
    finally:
        rp_scale.JobScaler = original
