"""A small fake of RunPod's worker control plane on 127.0.0.1 (job-take, job-take-batch,
job-stop, job-done, job-stream, ping), speaking the protocol runpod-python 1.12 uses."""
from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

from tests.fakes.http_server import close, serve

FINAL = ("COMPLETED", "FAILED", "CANCELLED")


@dataclass
class FakeJob:
    id: str
    input: Any
    status: str = "IN_QUEUE"
    worker: str | None = None
    stream: list = field(default_factory=list)  # items posted to job-stream, in order
    progress: list = field(default_factory=list)  # IN_PROGRESS updates posted to job-done
    output: Any = None
    error: str | None = None
    stop_pod: bool = False
    taken_at: float | None = None
    done_at: float | None = None
    late_stream_posts: int = 0  # stream items posted after the job was final (e.g. before a stop lands)
    late_results: int = 0  # job-done posts after the job was already final
    raw_input: bytes | None = None  # the input as raw body bytes (not JSON-encodable: too deep, bad UTF-8)

    def status_view(self) -> dict:
        """What GET /v2/{endpoint}/status/{id} would answer."""
        out = {"id": self.id, "status": self.status}
        if self.status == "COMPLETED":
            out["output"] = self.output
        if self.status == "FAILED":
            out["error"] = self.error
        return out


class FakeControlPlane:
    """Jobs are queued with `submit`; a worker takes them over HTTP; `cancel` stops one
    the way RunPod does (status CANCELLED, the id on the worker's job-stop channel)."""

    def __init__(self, api_key: str = "test-key", endpoint: str = "ep-test", hold_s: float = 0.25):
        self.api_key = api_key
        self.endpoint = endpoint
        self.hold_s = hold_s
        self.jobs: dict[str, FakeJob] = {}
        self.queue: list[str] = []
        self.stops: dict[str, list[str]] = {}  # worker id -> job ids to stop
        self.pings: list[dict] = []
        self.violations: list[str] = []  # protocol errors seen (bad auth, unknown job, ...)
        self.takes: list[dict] = []  # query of every job-take call
        self.take_times: list[float] = []  # when each job-take call arrived (monotonic)
        self.takes_held = 0  # job-take calls held open right now (a long-poll in flight)
        self.cond = threading.Condition()
        self._count = 0
        self._server: ThreadingHTTPServer | None = None

    # -- the test's side --------------------------------------------------------------
    def start(self) -> FakeControlPlane:
        self._server = serve(self._dispatch, http11=True)
        return self

    def stop(self):
        close(self._server)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}/v2/{self.endpoint}"

    def worker_env(self, worker_id: str = "worker-1") -> dict[str, str]:
        """The env RunPod gives a worker (the SDK replaces $ID and $RUNPOD_POD_ID)."""
        return {
            "RUNPOD_WEBHOOK_GET_JOB": f"{self.base}/job-take/$ID?gpu=cpu",
            "RUNPOD_WEBHOOK_POST_OUTPUT": f"{self.base}/job-done/$RUNPOD_POD_ID/$ID?gpu=cpu",
            "RUNPOD_WEBHOOK_POST_STREAM": f"{self.base}/job-stream/$RUNPOD_POD_ID/$ID?gpu=cpu",
            "RUNPOD_WEBHOOK_PING": f"{self.base}/ping/$RUNPOD_POD_ID?gpu=cpu",
            "RUNPOD_AI_API_KEY": self.api_key,
            "RUNPOD_POD_ID": worker_id,
            "RUNPOD_PING_INTERVAL": "1000",
            "RUNPOD_SKIP_AUTO_SYSTEM_CHECKS": "true",
            "RUNPOD_SKIP_GPU_CHECK": "true",
            "RUNPOD_LOG_LEVEL": "INFO",
        }

    def submit(self, job_input: Any, job_id: str | None = None) -> str:
        with self.cond:
            self._count += 1
            jid = job_id or f"job-{self._count:03d}"
            assert jid not in self.jobs
            self.jobs[jid] = FakeJob(jid, job_input)
            self.queue.append(jid)
            self.cond.notify_all()
        return jid

    def submit_raw(self, raw_input: bytes, job_id: str) -> str:
        """Queue a job whose input is sent as these bytes verbatim in the job-take body (a
        body a JSON encoder could not write: nested too deep, invalid UTF-8)."""
        with self.cond:
            assert job_id not in self.jobs
            self.jobs[job_id] = FakeJob(job_id, None, raw_input=raw_input)
            self.queue.append(job_id)
            self.cond.notify_all()
        return job_id

    def cancel(self, job_id: str) -> None:
        """POST /v2/{endpoint}/cancel/{id}: CANCELLED now; a worker holding it is told to stop."""
        with self.cond:
            job = self.jobs[job_id]
            if job.status in FINAL:
                return
            if job.status == "IN_QUEUE":
                self.queue.remove(job_id)
            elif job.worker:
                self.stops.setdefault(job.worker, []).append(job_id)
            job.status = "CANCELLED"
            job.done_at = time.monotonic()
            self.cond.notify_all()

    def status(self, job_id: str) -> dict:
        with self.cond:
            return self.jobs[job_id].status_view()

    def wait_for(self, predicate, timeout: float, what: str = "condition") -> None:
        deadline = time.monotonic() + timeout
        with self.cond:
            while not predicate():
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"timed out waiting for {what}: " + json.dumps(
                        {j.id: j.status for j in self.jobs.values()}))
                self.cond.wait(min(left, 0.2))

    def all_final(self, ids=None) -> bool:
        return all(self.jobs[i].status in FINAL for i in (ids or self.jobs))

    # -- the worker's side ----------------------------------------------------------------
    def _dispatch(self, req: BaseHTTPRequestHandler, method: str):
        url = urlsplit(req.path)
        query = {k: v[-1] for k, v in parse_qs(url.query).items()}
        length = int(req.headers.get("Content-Length") or 0)
        body = req.rfile.read(length) if length else b""
        if req.headers.get("Authorization") != self.api_key:
            self.violations.append(f"bad Authorization on {method} {url.path}")
            return self._reply(req, 401, {"error": "unauthorized"})
        parts = url.path.strip("/").split("/")  # v2, endpoint, route, worker, [job]
        if len(parts) < 4 or parts[0] != "v2" or parts[1] != self.endpoint:
            self.violations.append(f"unknown path {method} {url.path}")
            return self._reply(req, 404, {"error": "not found"})
        route, worker = parts[2], parts[3]
        if method == "GET" and route in ("job-take", "job-take-batch"):
            return self._take(req, worker, query, batch=route == "job-take-batch")
        if method == "GET" and route == "job-stop":
            return self._stop_poll(req, worker)
        if method == "GET" and route == "ping":
            with self.cond:
                self.pings.append({"worker": worker, **query, "at": time.monotonic()})
            return self._reply(req, 200, {})
        if method == "POST" and route in ("job-done", "job-stream") and len(parts) == 5:
            return self._post(req, route, worker, parts[4], query, body)
        self.violations.append(f"unexpected {method} {url.path}")
        return self._reply(req, 404, {"error": "not found"})

    def _take(self, req, worker: str, query: dict, batch: bool):
        want = int(query.get("batch_size", 1)) if batch else 1
        deadline = time.monotonic() + self.hold_s
        with self.cond:
            self.takes.append({"worker": worker, "batch": batch, **query})
            self.take_times.append(time.monotonic())
            self.takes_held += 1
            self.cond.notify_all()
            while not self.queue and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            self.takes_held -= 1
            taken, raw = [], False
            while self.queue and len(taken) < want:
                job = self.jobs[self.queue.pop(0)]
                job.status, job.worker, job.taken_at = "IN_PROGRESS", worker, time.monotonic()
                taken.append({"id": job.id, "input": job.input} if job.raw_input is None else
                             {"id": job.id, "raw_input": job.raw_input})
                raw = raw or job.raw_input is not None
            self.cond.notify_all()
        if not taken:
            return self._reply(req, 204, None)
        if raw:  # the body written by hand, each raw input spliced in as is
            items = [json.dumps(t).encode() if "raw_input" not in t else
                     b'{"id": ' + json.dumps(t["id"]).encode() + b', "input": ' + t["raw_input"] + b"}" for t in taken]
            return self._reply_raw(req, 200, b"[" + b", ".join(items) + b"]" if batch else items[0])
        return self._reply(req, 200, taken if batch else taken[0])

    def _stop_poll(self, req, worker: str):
        deadline = time.monotonic() + self.hold_s
        with self.cond:
            while not self.stops.get(worker) and time.monotonic() < deadline:
                self.cond.wait(deadline - time.monotonic())
            ids = self.stops.pop(worker, [])
        if not ids:
            return self._reply(req, 204, None)
        return self._reply(req, 200, {"jobsToStop": ids})

    def _post(self, req, route: str, worker: str, job_id: str, query: dict, body: bytes):
        try:
            data = json.loads(body.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            self.violations.append(f"{route} {job_id}: body is not JSON ({exc})")
            return self._reply(req, 400, {"error": "bad body"})
        with self.cond:
            job = self.jobs.get(job_id)
            if job is None or job.worker != worker:
                self.violations.append(f"{route} for a job {job_id} not held by {worker}")
                return self._reply(req, 404, {"error": "unknown job"})
            if route == "job-stream":
                if job.status in FINAL:
                    job.late_stream_posts += 1
                elif "output" not in data:
                    self.violations.append(f"stream post of {job_id} without output: {data}")
                else:
                    job.stream.append(data["output"])
            elif data.get("status") == "IN_PROGRESS":
                job.progress.append(data.get("output"))
            elif job.status in FINAL:
                job.late_results += 1
            else:
                if query.get("isStream") not in ("true", "false"):
                    self.violations.append(f"job-done of {job_id} without isStream")
                job.stop_pod = bool(data.get("stopPod"))
                if data.get("error"):
                    job.status, job.error = "FAILED", data["error"]
                else:
                    job.status, job.output = "COMPLETED", data.get("output")
                job.done_at = time.monotonic()
            self.cond.notify_all()
        return self._reply(req, 200, {})

    @staticmethod
    def _reply(req, code: int, payload):
        blob = b"" if payload is None else json.dumps(payload).encode()
        req.send_response(code)
        if payload is not None:
            req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(blob)))
        req.end_headers()
        if blob:
            req.wfile.write(blob)

    @staticmethod
    def _reply_raw(req, code: int, blob: bytes):
        """A JSON reply whose body bytes are given as they are."""
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(blob)))
        req.end_headers()
        req.wfile.write(blob)
