"""A small fake of RunPod's /v2 REST API on 127.0.0.1 (run, runsync, status, stream, cancel,
health) whose jobs run on the project's handler `Worker`, on an event loop in a thread."""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import traceback
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

FINAL = ("COMPLETED", "FAILED", "CANCELLED", "TIMED_OUT")
MAX_BODY = 10 * 1024 * 1024  # RunPod's payload limit for /run


@dataclass
class RestJob:
    id: str
    input: Any
    status: str = "IN_QUEUE"
    stream: list = field(default_factory=list)  # items the handler yielded, in order
    sent: int = 0  # stream items already returned by /stream
    output: Any = None
    error: str | None = None
    worker: str = "main"  # which worker ran it ("main", or "oom" for an injected failure)
    created: float = field(default_factory=time.monotonic)
    started: float | None = None
    finished: float | None = None
    task: Any = None  # the concurrent.futures.Future of its run on the loop

    def view(self) -> dict:
        """What GET /v2/{endpoint}/status/{id} answers."""
        out: dict[str, Any] = {"id": self.id, "status": self.status}
        if self.status == "COMPLETED":
            out["output"] = self.output
        if self.status == "FAILED":
            out["error"] = self.error
        if self.started is not None:
            out["delayTime"] = int((self.started - self.created) * 1000)
            if self.finished is not None:
                out["executionTime"] = int((self.finished - self.started) * 1000)
        return out


class FakeRestAPI:
    """`make_worker(**env)` builds a handler Worker (env: settings overrides); jobs run on one
    such worker, `concurrency` at a time, as the runpod SDK runs an async-generator handler with
    return_aggregate_stream. `fail_with_oom(predicate)` makes the next matching jobs run on a
    fresh worker whose engine injects a CUDA out-of-memory error into that job (FAULT_INJECTION)."""

    def __init__(self, make_worker: Callable[..., Any], *, api_key: str = "test-key", endpoint: str = "ep-test",
                 concurrency: int = 8):
        self.make_worker = make_worker
        self.api_key = api_key
        self.endpoint = endpoint
        self.concurrency = concurrency
        self.jobs: dict[str, RestJob] = {}
        self.calls: list[tuple[str, str]] = []  # (method, route) of every request
        self.violations: list[str] = []
        self.lock = threading.Lock()
        self._oom_rules: list[list] = []  # [predicate(job_input), times left]
        self.held = False  # while True, jobs stay IN_QUEUE (no worker free)
        self._loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: ThreadingHTTPServer | None = None
        self._worker = None
        self._slots: asyncio.Semaphore | None = None

    # -- the test's side ------------------------------------------------------------------
    def start(self) -> FakeRestAPI:
        self._loop_thread.start()

        async def setup():
            self._slots = asyncio.Semaphore(self.concurrency)
            self._worker = self.make_worker()
            # load its engine now (a fresh fault-injection worker may load beside it later; two
            # first loads at once in two threads race in transformers' lazy imports)
            warm = {"id": "warmup", "input": {"prompt": "hi", "sampling_params": {"max_tokens": 1}}}
            async with contextlib.aclosing(self._worker.handle(warm)) as items:
                async for _ in items:
                    pass

        asyncio.run_coroutine_threadsafe(setup(), self._loop).result(120)
        api = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                api._dispatch(self, "GET")

            def do_POST(self):
                api._dispatch(self, "POST")

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        threading.Thread(target=self._server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()

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

    def submit(self, job_input: Any) -> str:
        job = RestJob(f"{uuid.uuid4().hex[:12]}-e1", job_input)
        with self.lock:
            self.jobs[job.id] = job
        job.task = asyncio.run_coroutine_threadsafe(self._execute(job), self._loop)
        return job.id

    def cancel(self, job_id: str) -> dict:
        with self.lock:
            job = self.jobs[job_id]
            if job.status not in FINAL:
                job.status, job.finished = "CANCELLED", time.monotonic()
        if job.task is not None:
            job.task.cancel()
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
        with self.lock:
            states = [j.status for j in self.jobs.values()]
        running = states.count("IN_PROGRESS")
        return {"jobs": {"completed": states.count("COMPLETED"), "failed": states.count("FAILED"),
                         "inProgress": running, "inQueue": states.count("IN_QUEUE"), "retried": 0},
                "workers": {"idle": 0 if running else 1, "running": 1 if running else 0, "initializing": 0,
                            "ready": 1, "throttled": 0, "unhealthy": 0}}

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

    async def _execute(self, job: RestJob) -> None:
        while self.held:
            await asyncio.sleep(0.02)
        async with self._slots:
            with self.lock:
                if job.status != "IN_QUEUE":
                    return
                job.status, job.started = "IN_PROGRESS", time.monotonic()
            worker, temporary = self._pick_worker(job)
            try:
                async with contextlib.aclosing(worker.handle({"id": job.id, "input": job.input})) as items:
                    async for item in items:
                        if isinstance(item, dict) and item.get("error"):
                            # the SDK: an error item ends the stream, is not streamed, fails the job
                            return self._end(job, "FAILED", error=str(item["error"]))
                        with self.lock:
                            job.stream.append(item)
                self._end(job, "COMPLETED", output=list(job.stream))
            except asyncio.CancelledError:
                self._end(job, "CANCELLED")
                raise
            except Exception as exc:  # noqa: BLE001 - as the SDK reports a raised exception
                self._end(job, "FAILED", error=json.dumps({"error_type": str(type(exc)), "error_message": str(exc),
                                                           "error_traceback": traceback.format_exc()}))
            finally:
                if temporary:
                    await worker.aclose()

    def _end(self, job: RestJob, status: str, output: Any = None, error: str | None = None) -> None:
        with self.lock:
            if job.status in FINAL:
                return
            job.status, job.output, job.error, job.finished = status, output, error, time.monotonic()

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
            jid = self.submit(payload["input"])
            if route == "run":
                return self._reply(req, 200, {"id": jid, "status": "IN_QUEUE"})
            return self._reply(req, 200, self.wait_final(jid, 30))
        if method == "GET" and route == "health" and job_id is None:
            return self._reply(req, 200, self.health())
        with self.lock:
            job = self.jobs.get(job_id or "")
        if job is None:
            return self._reply(req, 404, {"error": f"job not found: {job_id}"})
        if method == "GET" and route == "status":
            with self.lock:
                return self._reply(req, 200, job.view())
        if method == "GET" and route == "stream":
            with self.lock:
                new, job.sent = job.stream[job.sent:], len(job.stream)
                view = {"id": job.id, "status": job.status, "stream": [{"output": item} for item in new]}
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
