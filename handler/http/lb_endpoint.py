"""A load-balancing endpoint's worker as the HTTP routes use it: no queue (RunPod's load balancer
sends each request straight here), so a request runs at once or is refused: 429 past the
worker's concurrency (MAX_CONCURRENCY and the free KV blocks, as the queue mode's concurrency
modifier computes it), 503 while the worker stops. Each request runs within LB_REQUEST_TIMEOUT_S
(RunPod cuts a load-balanced request at 5.5 minutes): its job's deadline, and past it by
GRACE_S a backstop that ends it `timeout` whatever it was doing."""
from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

from handler.errors import JobError
from handler.http.endpoint import JobEndpoint
from handler.http.job_queue import run_stored_job
from handler.http.jobs import CANCELLED, FAILED, Job, JobStore

log = logging.getLogger("handler.http")

RETRY_AFTER_S = 1  # a 429's Retry-After: about the time a short request takes to free its slot
GRACE_S = 5.0  # past its deadline, how long a request may take to end `timeout` on its own
UNBOUNDED_ROUTES = ("/v1/models",)  # answered at once, without the engine: they take no slot


class Refused(Exception):
    """A request the worker does not run: its HTTP status, coded error and headers."""

    def __init__(self, status: int, error: JobError, headers: dict[str, str] | None = None):
        super().__init__(error.message)
        self.status, self.error, self.headers = status, error, headers or {}


class BalancedEndpoint(JobEndpoint):
    """The worker's requests, each run as a job at once (handler.http.jobs keeps its state, as
    the local endpoint's; a finished job is let go with its request)."""

    def __init__(self, worker):
        super().__init__(worker, JobStore(run_ttl_s=0.0, runsync_ttl_s=0.0))
        self.timeout_s = worker.settings.lb_request_timeout_s
        self.concurrency = worker.settings.max_concurrency  # the modifier's last answer
        self.tasks: dict[str, asyncio.Task] = {}
        self.bounded: set[str] = set()  # the ids of the running jobs that hold a slot
        self.stopping: str | None = None  # why the worker stops taking requests (SIGTERM, ...)

    @property
    def running(self) -> int:
        return len(self.bounded)

    def submit(self, job_input: Any, *, sync: bool = True, size: int = 0) -> Job:
        """Run a job now; Refused when the worker stops (503) or has no free slot (429)."""
        if self.stopping:
            raise Refused(503, JobError("worker_shutdown", f"the worker is stopping ({self.stopping}) and takes no "
                                        "new request; send it again (another worker takes it)", retryable=True))
        slot = not (isinstance(job_input, dict) and job_input.get("openai_route") in UNBOUNDED_ROUTES)
        if slot:
            self._admit()
        job = self.store.new(self._within_deadline(job_input), sync=True, size=size)
        task = asyncio.get_running_loop().create_task(self._run(job))
        self.tasks[job.id] = task
        if slot:
            self.bounded.add(job.id)
        task.add_done_callback(lambda _t, jid=job.id: self._done(jid))
        return job

    def _admit(self) -> None:
        """A slot for one more request, or Refused 429 (overloaded, retryable)."""
        try:
            self.concurrency = max(0, int(self.worker.concurrency_modifier(self.concurrency)))
        except Exception:  # noqa: BLE001 - as the queue mode: keep the concurrency it had
            log.exception("the concurrency modifier failed; keeping %d", self.concurrency)
        if self.running >= self.concurrency:
            raise Refused(429, JobError(
                "overloaded", f"the worker runs {self.running} requests, as many as it holds now (MAX_CONCURRENCY="
                f"{self.worker.settings.max_concurrency} and its free KV cache); retry in {RETRY_AFTER_S}s or on "
                "another worker", retryable=True, concurrency=self.concurrency),
                {"Retry-After": str(RETRY_AFTER_S)})

    def _within_deadline(self, job_input: Any) -> Any:
        """The job's input with its `timeout_s` at most LB_REQUEST_TIMEOUT_S (the worker's own
        deadline then fails it `timeout` with its partial text); an input that is not an object,
        or a `timeout_s` that is not a positive number, is left for the job's checks to refuse."""
        if not isinstance(job_input, dict):
            return job_input
        own = job_input.get("timeout_s")
        if own is None or (isinstance(own, (int, float)) and not isinstance(own, bool) and own > self.timeout_s):
            return {**job_input, "timeout_s": self.timeout_s}
        return job_input

    async def _run(self, job: Job) -> None:
        """The job on the worker; the backstop ends it `timeout` GRACE_S past its deadline."""
        backstop = asyncio.get_running_loop().call_later(self.timeout_s + GRACE_S, self._expire, job)
        try:
            await run_stored_job(self.worker.handle, job, self.store)
        finally:
            backstop.cancel()

    def _expire(self, job: Job) -> None:
        error = JobError("timeout", f"the request ran past LB_REQUEST_TIMEOUT_S={self.timeout_s:g}s",
                         timeout_s=self.timeout_s)
        if self.store.end(job, FAILED, error=json.dumps(error.to_dict(), ensure_ascii=False)):
            log.warning("[job %s] still running %gs past LB_REQUEST_TIMEOUT_S: cancelled", job.id, GRACE_S)
            self._cancel_task(job)

    def _done(self, job_id: str) -> None:
        self.tasks.pop(job_id, None)
        self.bounded.discard(job_id)

    def cancel(self, job: Job) -> dict:
        """The client went away: the job ends CANCELLED, its engine requests aborted."""
        self.store.end(job, CANCELLED)
        self._cancel_task(job)
        return {"id": job.id, "status": job.status}

    def _cancel_task(self, job: Job) -> None:
        task = self.tasks.get(job.id)
        if task is not None:
            task.cancel()

    # -- stopping --------------------------------------------------------------------------
    async def drain(self, reason: str) -> None:
        """Stop taking requests (503; /ping unhealthy), let the running ones end within
        DRAIN_TIMEOUT_S; then those still running fail worker_shutdown with their partial text
        (the worker's drain aborts their engine requests), and any left GRACE_S later are ended so."""
        self.stopping = reason
        drain = self.worker.drain
        drain.begin(reason)
        log.info("%s: no new request; %d running, the drain ends in %gs (DRAIN_TIMEOUT_S)", reason,
                 len(self.tasks), drain.timeout_s)
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=drain.timeout_s)
        if not self.tasks:
            return
        log.warning("drain deadline: DRAIN_TIMEOUT_S=%gs passed with %d request(s) running: they fail "
                    "worker_shutdown (retryable)", drain.timeout_s, len(self.tasks))
        try:
            await asyncio.wait_for(drain.expire(), GRACE_S)
        except TimeoutError:
            log.warning("drain deadline: the engine did not take the aborts within %gs", GRACE_S)
        if self.tasks:
            await asyncio.wait(list(self.tasks.values()), timeout=GRACE_S)
        error = json.dumps(drain.shutdown_error(running=True).to_dict(), ensure_ascii=False)
        for job_id, task in list(self.tasks.items()):
            job = self.store.jobs.get(job_id)
            if job is not None:
                self.store.end(job, FAILED, error=error)
            task.cancel()

    async def close(self) -> None:
        """Cancel what still runs, stop the worker's engine."""
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        await self.worker.aclose()
