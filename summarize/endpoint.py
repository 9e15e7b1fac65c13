"""Endpoint mode of `summarize`: one `summarize` job per document on a RunPod endpoint
through the runpod SDK, polling /status itself so a FAILED job's error object is kept."""
from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from summarize.inputs import Document
from summarize.names import shown
from summarize.runner import Attempt, FatalError

log = logging.getLogger("summarize")

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
MAX_PAYLOAD_BYTES = 10 * 1024 * 1024 - 64 * 1024  # RunPod's /run limit is 10 MB; room for the envelope
MAX_POLL_FAILURES = 8  # status calls in a row that may fail (network, 5xx) before the attempt is given up


def _http_status(exc: Exception) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


class EndpointRunner:
    """Submits with `runpod.Endpoint(id).run(...)`; reads each job's /status JSON (run_sync
    would return only the output, so a FAILED job's error would be lost)."""

    def __init__(self, endpoint_id: str, *, api_key: str | None = None, base_url: str | None = None,
                 concurrency: int = 8, job_timeout_s: float = 1800.0, poll_s: tuple[float, float] = (0.25, 2.0),
                 notify: Callable[[str], None] = log.info):
        try:
            import runpod
            from runpod.endpoint.helpers import UNAUTHORIZED_MSG
        except ImportError:
            raise FatalError("endpoint mode needs the runpod package (pip install runpod)") from None
        key = api_key or os.environ.get("RUNPOD_API_KEY") or runpod.api_key
        if not key:
            raise FatalError("no RunPod API key: set RUNPOD_API_KEY or pass --api-key")
        self.endpoint_id = endpoint_id
        self.endpoint = runpod.Endpoint(endpoint_id, api_key=key)
        self.client = self.endpoint.rp_client
        # the SDK reads RUNPOD_ENDPOINT_BASE_URL once, when `runpod` is first imported: read it now
        base = base_url or os.environ.get("RUNPOD_ENDPOINT_BASE_URL")
        if base:
            self.client.endpoint_url_base = base.rstrip("/")
        self.label = f"endpoint {endpoint_id}"
        self.notify = notify
        self.job_timeout_s = job_timeout_s
        self.poll_s = poll_s
        self.cancelled: list[str] = []  # jobs in flight cancelled when the run was interrupted
        self._unauthorized = UNAUTHORIZED_MSG
        self._gpu = 0.0
        self._gpu_known = False
        self._pool = ThreadPoolExecutor(max_workers=max(4, concurrency + 2), thread_name_prefix="summarize-http")

    @property
    def base_url(self) -> str:
        return self.client.endpoint_url_base

    async def _call(self, fn, *args):
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _fatal(self, exc: Exception) -> FatalError | None:
        if isinstance(exc, RuntimeError) and str(exc) == self._unauthorized:
            return FatalError(f"{self.base_url}: the API key was refused (401); check RUNPOD_API_KEY")
        return None

    async def start(self) -> None:
        """One /health call: a wrong key, a wrong id or an unreachable API stop the run here."""
        try:
            health = await self._call(self.endpoint.health)
        except Exception as exc:  # noqa: BLE001 - every failure here ends the run, with its reason
            fatal = self._fatal(exc)
            if fatal is not None:
                raise fatal from None
            if _http_status(exc) == 404:
                raise FatalError(f"endpoint {self.endpoint_id} not found at {self.base_url}") from None
            raise FatalError(f"cannot reach {self.base_url}: {type(exc).__name__}: {exc}") from None
        workers = health.get("workers", {}) if isinstance(health, dict) else {}
        jobs = health.get("jobs", {}) if isinstance(health, dict) else {}
        self.notify(f"endpoint {self.endpoint_id}: workers {json.dumps(workers)}, jobs {json.dumps(jobs)}")

    async def attempt(self, doc: Document, job_input: dict) -> Attempt:
        body = {"input": job_input}
        size = len(json.dumps(body, ensure_ascii=False).encode("utf-8"))
        if size > MAX_PAYLOAD_BYTES:
            return Attempt("FAILED", error={"code": "too_large", "message": f"the document is {size} bytes as a job; "
                                            "a RunPod job takes at most 10 MB", "retryable": False})
        submitted = asyncio.ensure_future(self._call(self.endpoint.run, body))
        try:
            job = await asyncio.shield(submitted)
        except asyncio.CancelledError:  # interrupted while the POST was out: cancel the job it made
            try:
                job = await asyncio.wait_for(submitted, 15)
            except Exception as exc:  # noqa: BLE001 - no job was made, or its id never came back
                log.warning("%s: interrupted while submitting (%s: %s)", shown(doc.doc), type(exc).__name__, exc)
            else:
                await self._cancel(job)
            raise
        except Exception as exc:  # noqa: BLE001 - a refused submission fails this attempt, with the reason
            fatal = self._fatal(exc)
            if fatal is not None:
                raise fatal from None
            status = _http_status(exc)
            retryable = status is None or status >= 500 or status == 429
            return Attempt("FAILED", error={"code": "submit_failed", "message": f"POST /run: {type(exc).__name__}: "
                                            f"{exc}", "retryable": retryable})
        try:
            state = await self._wait(job.job_id)
        except asyncio.CancelledError:
            await self._cancel(job)
            raise
        seconds = state.get("executionTime")
        gpu = seconds / 1000.0 if isinstance(seconds, (int, float)) else None
        if gpu is not None:
            self._gpu += gpu
            self._gpu_known = True
        return Attempt(state["status"], state.get("output"), state.get("error"), job.job_id, gpu)

    async def _wait(self, job_id: str) -> dict:
        """Poll /status until the job is final (or the client's own deadline passes)."""
        delay, slowest = self.poll_s
        deadline = time.monotonic() + self.job_timeout_s
        failures = 0
        last = "IN_QUEUE"
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 1.5, slowest)
            try:
                state = await self._call(self.client.get, f"{self.endpoint_id}/status/{job_id}")
            except Exception as exc:  # noqa: BLE001 - sorted below: fatal, lost, or transient
                fatal = self._fatal(exc)
                if fatal is not None:
                    raise fatal from None
                if _http_status(exc) == 404:
                    return {"status": "FAILED", "error": {"code": "job_lost", "message": f"job {job_id} is unknown "
                                                          "to the endpoint (expired?)", "retryable": True}}
                failures += 1
                log.warning("status of job %s: %s: %s (%d in a row)", job_id, type(exc).__name__, exc, failures)
                if failures >= MAX_POLL_FAILURES:
                    await self._cancel_id(job_id)
                    return {"status": "FAILED", "error": {"code": "endpoint_unreachable", "message": f"{failures} "
                                                          f"status calls failed in a row: {exc}", "retryable": True}}
                continue
            failures = 0
            last = state.get("status", last)
            if last in FINAL:
                return state
            if time.monotonic() > deadline:
                await self._cancel_id(job_id)
                return {"status": "FAILED", "error": {
                    "code": "timeout", "message": f"no result within --job-timeout {self.job_timeout_s:g}s "
                    f"(the job was {last}); it was cancelled", "retryable": True}}

    async def _cancel(self, job) -> None:
        self.cancelled.append(job.job_id)
        await self._cancel_id(job.job_id)

    async def _cancel_id(self, job_id: str) -> None:
        try:
            await asyncio.wait_for(self._call(self.client.post, f"{self.endpoint_id}/cancel/{job_id}", None, 5), 6)
        except Exception as exc:  # noqa: BLE001 - a failed cancel is reported, the run goes on
            log.warning("could not cancel job %s: %s: %s", job_id, type(exc).__name__, exc)

    def gpu_seconds(self, elapsed: float) -> float | None:
        return self._gpu if self._gpu_known else None

    async def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
