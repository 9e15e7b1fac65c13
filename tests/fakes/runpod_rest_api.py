"""A small fake of RunPod's /v2 REST API on 127.0.0.1 (run, runsync, status, stream, cancel,
health) whose jobs run on the project's handler `Worker`, on an event loop in a thread."""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from handler.http.job_queue import JobQueue, run_stored_job
from handler.http.jobs import CANCELLED, FINAL, NOT_FOUND, Job, JobStore
from tests.fakes.http_server import close, serve

MAX_BODY = 10 * 1024 * 1024  # RunPod's payload limit for /run
RestJob = Job  # the package's job, as the local endpoint (`python -m handler --serve`) keeps it


class FakeRestAPI:
    """`make_worker(**env)` builds a handler Worker (env: settings overrides); jobs run on one
    such worker, `concurrency` at a time, as the runpod SDK runs an async-generator handler with
    return_aggregate_stream. `fail_with_oom(predicate)` makes the next matching jobs run on a
    fresh worker whose engine injects a CUDA out-of-memory error into that job (FAULT_INJECTION).
    The jobs, their views and their end by the SDK's rules are the package's (handler.http), as
    the local endpoint keeps them; the transport (threads, auth, one endpoint id) is the fake's."""

    def __init__(self, make_worker: Callable[..., Any], *, api_key: str = "test-key", endpoint: str = "ep-test",
                 concurrency: int = 8):
        self.make_worker = make_worker
        self.api_key = api_key
        self.endpoint = endpoint
        self.concurrency = concurrency
        self.store = JobStore()
        self.jobs: dict[str, RestJob] = self.store.jobs
        self.inputs: dict[str, Any] = {}  # each job's input as submitted (the store lets it go at the job's end)
        self.calls: list[tuple[str, str]] = []  # (method, route) of every request
        self.violations: list[str] = []
        self.lock = self.store.lock
        self._oom_rules: list[list] = []  # [predicate(job_input), times left]
        self.held = False  # while True, jobs stay IN_QUEUE (no worker free)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: ThreadingHTTPServer | None = None
        self._worker = None
        self._queue: JobQueue | None = None

    # -- the test's side ------------------------------------------------------------------
    def start(self) -> FakeRestAPI:
        self._loop_thread.start()

        async def setup():
            self._worker = self.make_worker()
            self._queue = _FakeQueue(self)
            self._queue.start()
            # load its engine now (a fresh fault-injection worker may load beside it later; two
            # first loads at once in two threads race in transformers' lazy imports)
            warm = {"id": "warmup", "input": {"prompt": "hi", "sampling_params": {"max_tokens": 1}}}
            async with contextlib.aclosing(self._worker.handle(warm)) as items:
                async for _ in items:
                    pass

        asyncio.run_coroutine_threadsafe(setup(), self._loop).result(120)
        self._server = serve(self._dispatch, http11=True)
        return self

    def stop(self) -> None:
        close(self._server)

        async def teardown():
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for t in tasks:
                t.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            if self._worker is not None:
                await self._worker.aclose()

        asyncio.run_coroutine_threadsafe(teardown(), self._loop).result(30)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._loop_thread.join(10)
        self._loop.close()

    def __enter__(self) -> FakeRestAPI:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v2"

    @property
    def worker(self):
        return self._worker

    def fail_with_oom(self, predicate: Callable[[Any], bool], times: int = 1) -> None:
        """The next `times` jobs whose input matches fail with the worker's own out_of_memory."""
        with self.lock:
            self._oom_rules.append([predicate, times])

    def submit(self, job_input: Any, sync: bool = False, jid: str | None = None) -> str:
        job = self.store.new(job_input, sync=sync, jid=jid)
        self.inputs[job.id] = job_input
        self._loop.call_soon_threadsafe(self._queue.submit, job)
        return job.id

    def cancel(self, job_id: str) -> dict:
        job = self.jobs[job_id]
        self.store.end(job, CANCELLED)  # at once, as RunPod marks it; the worker's task is cancelled next
        self._loop.call_soon_threadsafe(self._queue.cancel, job)
        return {"id": job_id, "status": job.status}

    def statuses(self) -> dict[str, str]:
        with self.lock:
            return {j.id: j.status for j in self.jobs.values()}

    def wait_final(self, job_id: str, timeout: float) -> dict:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self.lock:
                if self.jobs[job_id].status in FINAL:
                    return self.jobs[job_id].view()
            time.sleep(0.02)
        with self.lock:
            return self.jobs[job_id].view()

    def health(self) -> dict:
        return self.store.health()

    # -- running a job, as the SDK's worker loop would ----------------------------------------
    def _pick_worker(self, job: RestJob) -> tuple[Any, bool]:
        with self.lock:
            for rule in self._oom_rules:
                if rule[1] > 0 and rule[0](job.input):
                    rule[1] -= 1
                    job.worker = "oom"
                    break
        if job.worker == "oom":
            fault = {"oom_at_step": 1, "oom_request_id": job.id}  # a fresh engine: its first step holds the job
            return self.make_worker(FAULT_INJECTION=json.dumps(fault)), True
        return self._worker, False

    async def execute(self, job: RestJob) -> None:
        if job.status != "IN_QUEUE":  # cancelled before it started
            return
        worker, temporary = self._pick_worker(job)
        try:
            await run_stored_job(worker.handle, job, self.store, job.worker)
        finally:
            if temporary:
                await worker.aclose()

    # -- HTTP --------------------------------------------------------------------------------
    def _dispatch(self, req: BaseHTTPRequestHandler, method: str) -> None:
        path = urlsplit(req.path).path
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        parts = path.strip("/").split("/")  # v2, endpoint, route, [job]
        route = parts[2] if len(parts) > 2 else ""
        with self.lock:
            self.calls.append((method, route))
        if req.headers.get("Authorization") != f"Bearer {self.api_key}":
            self.violations.append(f"bad Authorization on {method} {path}")
            return self._reply(req, 401, {"error": "Unauthorized"})
        if len(parts) < 3 or parts[0] != "v2" or parts[1] != self.endpoint:
            return self._reply(req, 404, {"error": f"endpoint not found: {path}"})
        job_id = parts[3] if len(parts) > 3 else None
        if method == "POST" and route in ("run", "runsync") and job_id is None:
            if len(body) > MAX_BODY:
                return self._reply(req, 400, {"error": "payload too large (10 MB at most)"})
            try:
                payload = json.loads(body or b"{}")
            except json.JSONDecodeError:
                return self._reply(req, 400, {"error": "body is not JSON"})
            if not isinstance(payload, dict) or "input" not in payload:
                return self._reply(req, 400, {"error": "body must be an object with input"})
            jid = self.submit(payload["input"], sync=route == "runsync")
            if route == "run":
                return self._reply(req, 200, {"id": jid, "status": "IN_QUEUE"})
            return self._reply(req, 200, self.wait_final(jid, 30))
        if method == "GET" and route == "health" and job_id is None:
            return self._reply(req, 200, self.health())
        job = self.store.get(job_id or "")
        if job is None:
            return self._reply(req, 404, NOT_FOUND)
        if method == "GET" and route == "status":
            with self.lock:
                return self._reply(req, 200, job.view())
        if method == "GET" and route == "stream":
            with self.lock:
                view = job.take_stream()
            return self._reply(req, 200, view)
        if method == "POST" and route == "cancel":
            return self._reply(req, 200, self.cancel(job.id))
        self.violations.append(f"unexpected {method} {path}")
        return self._reply(req, 404, {"error": "not found"})

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, code: int, payload: Any) -> None:
        data = json.dumps(payload, ensure_ascii=False).encode("utf-8")
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(data)))
        req.end_headers()
        req.wfile.write(data)


class _FakeQueue(JobQueue):
    """The package's job queue at the fake's concurrency (none while `held`), a job on the worker
    the fake picks for it."""

    def __init__(self, api: FakeRestAPI):
        super().__init__(api.store, api.worker.handle, lambda current: 0 if api.held else api.concurrency)
        self.api = api

    async def execute(self, job: RestJob) -> None:
        await self.api.execute(job)
