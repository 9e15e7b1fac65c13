"""A small fake of RunPod's OpenAI-compatible proxy (`/v2/<endpoint>/openai/v1/...`) in front
of the fake control plane: each request becomes an `openai_route` job (the body as its
`openai_input`, as RunPod's proxy hands it to worker-vllm) queued on the FakeControlPlane, where
a real runpod SDK worker loop (`python -m handler`) takes it. The answer is the job's output (one
response object), or with `stream: true` its streamed items as server-sent events ending
`data: [DONE]`; a FAILED job answers an OpenAI error built as the local endpoint builds it
(handler.http.openai_routes), so both fakes answer alike."""
from __future__ import annotations

import json
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import urlsplit

from tests.fakes.http_server import close, serve
from tests.fakes.runpod_control_plane import FINAL, FakeControlPlane

ROUTES = {("POST", "chat/completions"): "/v1/chat/completions", ("POST", "completions"): "/v1/completions",
          ("POST", "responses"): "/v1/responses", ("GET", "models"): "/v1/models"}


def _error(job) -> tuple[int, dict]:
    from handler.http.jobs import Job
    from handler.http.openai_routes import HTTP_STATUS, error_object

    body = error_object(Job(job.id, job.input, status=job.status, error=job.error))
    return HTTP_STATUS.get(body["error"].get("code"), 500), body


class FakeOpenAIProxy:
    """`base_url` + `/v2/<any endpoint>/openai/v1` is what an OpenAI client is given."""

    def __init__(self, plane: FakeControlPlane, timeout_s: float = 300.0):
        self.plane = plane
        self.timeout_s = timeout_s
        self.requests: list[tuple[str, str]] = []  # (route, job id) of every request, in order
        self._server: ThreadingHTTPServer | None = None

    def start(self) -> FakeOpenAIProxy:
        self._server = serve(self._dispatch)
        return self

    def stop(self) -> None:
        close(self._server)

    def __enter__(self) -> FakeOpenAIProxy:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    # -- a request ---------------------------------------------------------------------------
    def _dispatch(self, req: BaseHTTPRequestHandler, method: str) -> None:
        parts = urlsplit(req.path).path.strip("/").split("/")  # v2, endpoint, openai, v1, route...
        route = ROUTES.get((method, "/".join(parts[4:])))
        if len(parts) < 5 or parts[0] != "v2" or parts[2:4] != ["openai", "v1"] or route is None:
            return self._reply(req, 404, {"error": f"not found: {method} {req.path}"})
        body: Any = None
        if method == "POST":
            length = int(req.headers.get("Content-Length") or 0)
            try:
                body = json.loads(req.rfile.read(length) or b"null")
            except ValueError:
                return self._reply(req, 400, {"error": {"message": "the body is not JSON", "type":
                                                        "invalid_request_error", "code": "invalid_input"}})
        job_input = {"openai_route": route} if body is None else {"openai_route": route, "openai_input": body}
        jid = self.plane.submit(job_input)
        self.requests.append((route, jid))
        if isinstance(body, dict) and body.get("stream") is True:
            return self._stream(req, jid)
        self.plane.wait_for(lambda: self.plane.jobs[jid].status in FINAL, self.timeout_s, f"job {jid}")
        job = self.plane.jobs[jid]
        if job.status != "COMPLETED":
            return self._reply(req, *_error(job))
        out = job.output
        return self._reply(req, 200, out[-1] if isinstance(out, list) and len(out) == 1 else out)

    def _stream(self, req: BaseHTTPRequestHandler, jid: str) -> None:
        """The job's stream items as SSE while they come (the connection's end ends the body)."""
        from handler.http.openai_routes import DONE, sse

        plane = self.plane
        plane.wait_for(lambda: plane.jobs[jid].stream or plane.jobs[jid].status in FINAL, self.timeout_s, jid)
        job = plane.jobs[jid]
        if not job.stream and job.status != "COMPLETED":
            return self._reply(req, *_error(job))
        req.send_response(200)
        req.send_header("Content-Type", "text/event-stream")
        req.send_header("Cache-Control", "no-cache")
        req.send_header("Connection", "close")
        req.end_headers()
        sent, done = 0, False
        while True:
            plane.wait_for(lambda: len(job.stream) > sent or job.status in FINAL, self.timeout_s, jid)
            with plane.cond:
                new, final = job.stream[sent:], job.status in FINAL
            sent += len(new)
            for item in new:
                text = sse(item)
                done = done or text.rstrip().endswith("data: [DONE]")
                req.wfile.write(text.encode("utf-8"))
                req.wfile.flush()
            if final and sent == len(job.stream):
                break
        if job.status != "COMPLETED":
            req.wfile.write(f"data: {json.dumps(_error(job)[1])}\n\n".encode("utf-8"))
        if not done:
            req.wfile.write(DONE.encode("utf-8"))
        req.wfile.flush()
        req.close_connection = True

    @staticmethod
    def _reply(req: BaseHTTPRequestHandler, code: int, payload: Any) -> None:
        blob = json.dumps(payload).encode()
        req.send_response(code)
        req.send_header("Content-Type", "application/json")
        req.send_header("Content-Length", str(len(blob)))
        req.end_headers()
        req.wfile.write(blob)
