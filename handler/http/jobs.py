"""The endpoint's jobs as RunPod's /v2 API shows them: their states, their /status and
/stream views, /health's counts, and how long a finished job is kept (RunPod: 30 minutes
after a /run job ends, 1 minute after a /runsync one), within the bounds of the jobs waiting
and the bytes kept (SERVE_MAX_QUEUED_JOBS, SERVE_MAX_RETAINED_MB)."""
from __future__ import annotations

import asyncio
import json
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
    size: int = 0  # bytes it holds: its input's until it ends, then its result's
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


class StoreFull(Exception):
    """A new job the bounds leave no room for (answered 429); the message names the setting."""


class JobStore:
    """The endpoint's jobs by id, under one lock (the tests' fake reads them from other threads);
    finished jobs are forgotten once their retention passed, or sooner, oldest first, when the
    bytes kept pass `max_bytes`. At most `max_queued` jobs wait."""

    def __init__(self, run_ttl_s: float = RUN_TTL_S, runsync_ttl_s: float = RUNSYNC_TTL_S, *,
                 max_queued: int | None = None, max_bytes: int | None = None):
        self.jobs: dict[str, Job] = {}
        self.lock = threading.Lock()
        self.run_ttl_s, self.runsync_ttl_s = run_ttl_s, runsync_ttl_s
        self.max_queued, self.max_bytes = max_queued, max_bytes
        self.retained_bytes = 0

    @classmethod
    def for_settings(cls, settings: Any) -> JobStore:
        mb = getattr(settings, "serve_max_retained_mb", None)
        return cls(max_queued=getattr(settings, "serve_max_queued_jobs", None),
                   max_bytes=int(mb * 1024 * 1024) if mb else None)

    def new(self, job_input: Any, *, sync: bool = False, jid: str | None = None, size: int = 0) -> Job:
        """A job of `size` bytes of input; StoreFull when the bounds leave no room for it."""
        job = Job(jid or job_id(sync), job_input, sync=sync, size=size)
        with self.lock:
            self._expire()
            if self.max_queued and sum(j.status == IN_QUEUE for j in self.jobs.values()) >= self.max_queued:
                raise StoreFull(f"{self.max_queued} jobs are waiting already (SERVE_MAX_QUEUED_JOBS): retry later")
            held = sum(j.size for j in self.jobs.values() if j.finished is None)  # finished ones can go
            if self.max_bytes and held + size > self.max_bytes:
                raise StoreFull(f"the jobs not finished hold {held / 2**20:.1f} MB, and this one {size / 2**20:.1f} "
                                "MB more is past SERVE_MAX_RETAINED_MB: retry later")
            self.jobs[job.id] = job
            self.retained_bytes += size
            self._expire()
        return job

    def get(self, jid: str) -> Job | None:
        with self.lock:
            self._expire()
            return self.jobs.get(jid)

    def _expire(self) -> None:
        now = time.monotonic()
        gone = [j.id for j in self.jobs.values() if j.finished is not None
                and now - j.finished > (self.runsync_ttl_s if j.sync else self.run_ttl_s)]
        if self.max_bytes and self.retained_bytes > self.max_bytes:  # the oldest finished go first
            kept = self.retained_bytes - sum(self.jobs[jid].size for jid in gone)
            for j in sorted((j for j in self.jobs.values() if j.finished is not None and j.id not in gone),
                            key=lambda j: j.finished):
                if kept <= self.max_bytes:
                    break
                gone.append(j.id)
                kept -= j.size
        for jid in gone:
            self.retained_bytes -= self.jobs.pop(jid).size

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
        size = len(json.dumps(output, ensure_ascii=False, default=str)) if output is not None else 0
        size += len(error or "")
        with self.lock:
            if job.status in FINAL:
                return False
            job.status, job.output, job.error, job.finished = status, output, error, time.monotonic()
            job.started = job.started or job.finished
            job.input = None  # not needed any more: only its result is kept
            if job.id in self.jobs:
                self.retained_bytes += size - job.size
            job.size = size
            self._expire()
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
