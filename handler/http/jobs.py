"""The endpoint's jobs as RunPod's /v2 API shows them: their states, their /status and
/stream views, /health's counts, and how long a finished job is kept (RunPod: 30 minutes
after a /run job ends, 1 minute after a /runsync one)."""
from __future__ import annotations

import asyncio
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

IN_QUEUE, IN_PROGRESS, COMPLETED, FAILED, CANCELLED, TIMED_OUT = (
    "IN_QUEUE", "IN_PROGRESS", "COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
FINAL = (COMPLETED, FAILED, CANCELLED, TIMED_OUT)
RUN_TTL_S = 30 * 60.0  # RunPod keeps a /run job's result this long after it ends
RUNSYNC_TTL_S = 60.0  # ... and a /runsync job's
NOT_FOUND = {"error": "request does not exist"}  # RunPod's 404 body for an id it does not know (any more)


def job_id(sync: bool = False) -> str:
    """An id shaped as RunPod's: `<uuid>-u1`, `sync-<uuid>-u1` for /runsync."""
    return f"{'sync-' if sync else ''}{uuid.uuid4()}-u1"


@dataclass(eq=False)
class Job:
    """One job: its input, state, the items its handler streamed, its end."""

    id: str
    input: Any
    sync: bool = False  # submitted by /runsync (kept 1 minute, not 30)
    status: str = IN_QUEUE
    stream: list = field(default_factory=list)  # items the handler yielded, in order
    sent: int = 0  # stream items already returned by /stream
    output: Any = None
    error: str | None = None
    progress: Any = None  # the last progress_update while IN_PROGRESS (RunPod shows it as output)
    worker: str = "local"  # the worker that runs it
    created: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    _changed: asyncio.Event = field(default_factory=asyncio.Event, repr=False)

    def view(self) -> dict:
        """What GET /v2/{endpoint}/status/{id} answers."""
        out: dict[str, Any] = {"id": self.id, "status": self.status}
        if self.status == COMPLETED:
            out["output"] = self.output
        elif self.status == FAILED:
            out["error"] = self.error
        elif self.status == IN_PROGRESS and self.progress is not None:
            out["output"] = self.progress
        if self.started is not None:
            out["delayTime"] = int((self.started - self.created) * 1000)
            out["workerId"] = self.worker
            if self.finished is not None:
                out["executionTime"] = int((self.finished - self.started) * 1000)
        return out

    def take_stream(self) -> dict:
        """What GET /v2/{endpoint}/stream/{id} answers: the items not returned before."""
        new, self.sent = self.stream[self.sent:], len(self.stream)
        out: dict[str, Any] = {"id": self.id, "status": self.status, "stream": [{"output": i} for i in new]}
        if self.status == FAILED:
            out["error"] = self.error
        return out

    def changed(self) -> asyncio.Event:
        """An event set at the job's next change (a new item, its end); take it before reading the job."""
        return self._changed

    def notify(self) -> None:
        event, self._changed = self._changed, asyncio.Event()
        event.set()


class JobStore:
    """The endpoint's jobs by id, under one lock (the tests' fake reads them from other threads);
    finished jobs are forgotten once their retention passed."""

    def __init__(self, run_ttl_s: float = RUN_TTL_S, runsync_ttl_s: float = RUNSYNC_TTL_S):
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.run_ttl_s, self.runsync_ttl_s = run_ttl_s, runsync_ttl_s

    def new(self, job_input: Any, *, sync: bool = False, jid: str | None = None) -> Job:
        job = Job(jid or job_id(sync), job_input, sync=sync)
        with self.lock:
            self._expire()
            self.jobs[job.id] = job
        return job

    def get(self, jid: str) -> Job | None:
        with self.lock:
            self._expire()
            return self.jobs.get(jid)

    def _expire(self) -> None:
        now = time.monotonic()
        gone = [j.id for j in self.jobs.values() if j.finished is not None
                and now - j.finished > (self.runsync_ttl_s if j.sync else self.run_ttl_s)]
        for jid in gone:
            del self.jobs[jid]

    # -- a job's life (called by the job queue) ---------------------------------------------
    def start(self, job: Job, worker: str | None = None) -> bool:
        """IN_QUEUE -> IN_PROGRESS; False when the job is no longer queued (cancelled)."""
        with self.lock:
            if job.status != IN_QUEUE:
                return False
            job.status, job.started = IN_PROGRESS, time.monotonic()
            job.worker = worker or job.worker
        job.notify()
        return True

    def add(self, job: Job, item: Any) -> None:
        with self.lock:
            job.stream.append(item)
        job.notify()

    def end(self, job: Job, status: str, output: Any = None, error: str | None = None) -> bool:
        """The job's end, once: a job already final (cancelled meanwhile) stays as it is."""
        assert status in FINAL, status
        with self.lock:
            if job.status in FINAL:
                return False
            job.status, job.output, job.error, job.finished = status, output, error, time.monotonic()
            job.started = job.started or job.finished
        job.notify()
        return True

    def progress(self, job: dict, payload: Any) -> None:
        """runpod.serverless.progress_update's counterpart: the worker's progress for a job."""
        found = self.get(job.get("id", ""))
        if found is not None and found.status == IN_PROGRESS:
            found.progress = payload
            found.notify()

    def health(self, *, unhealthy: bool = False) -> dict:
        """GET /v2/{endpoint}/health: job counts by state (of the jobs still kept) and the one worker."""
        with self.lock:
            self._expire()
            states = [j.status for j in self.jobs.values()]
        running = states.count(IN_PROGRESS)
        return {"jobs": {"completed": states.count(COMPLETED), "failed": states.count(FAILED),
                         "inProgress": running, "inQueue": states.count(IN_QUEUE), "retried": 0},
                "workers": {"idle": 0 if running or unhealthy else 1, "running": 1 if running else 0,
                            "initializing": 0, "ready": 0 if unhealthy else 1, "throttled": 0,
                            "unhealthy": 1 if unhealthy else 0}}
