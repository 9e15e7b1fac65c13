"""RunPod's OpenAI-compatible routes under /v2/{endpoint_id}/openai/v1: each request becomes an
`openai_route` job with the body as its `openai_input` (as RunPod's proxy sends it to
worker-vllm), answered with the job's output: the response object, or with `stream: true`
the job's stream items as server-sent events, ending `data: [DONE]`. A FAILED job answers
an OpenAI error (`{"error": {"message", "type", "param", "code", ...}}`, the job's error object
inside it) with an HTTP status from its code; once streaming, as a last `data: {"error"}` event."""
from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from handler.http.endpoint import JobEndpoint
from handler.http.jobs import COMPLETED, FAILED, FINAL, Job
from handler.http.rest import ENDPOINT, MAX_RUNSYNC_BODY, body_timeout, dumps, read_json, reply

log = logging.getLogger("handler.http")

HTTP_STATUS = {"invalid_input": 400, "prompt_too_long": 400, "kv_capacity": 400, "truncated": 400,
               "overloaded": 429, "worker_shutdown": 503, "engine_dead": 503, "timeout": 504}
DONE = "data: [DONE]\n\n"


def error_object(job: Job) -> dict:
    """A FAILED or CANCELLED job's error as OpenAI clients read it."""
    err: dict[str, Any]
    if job.status == FAILED:
        try:
            err = json.loads(job.error or "")
        except ValueError:
            err = None
        if not isinstance(err, dict):
            err = {"code": "internal_error", "message": str(job.error), "retryable": False}
    else:
        err = {"code": "cancelled", "message": f"the job ended {job.status}", "retryable": False}
    return openai_error(err)


def openai_error(err: dict) -> dict:
    """An error object (`{"code", "message", "retryable", ...}`) as OpenAI clients read it."""
    status = HTTP_STATUS.get(err.get("code"), 500)
    kind = "invalid_request_error" if status == 400 else "server_error"
    return {"error": {**err, "message": err.get("message", ""), "type": kind, "param": err.get("field")}}


def error_reply(job: Job) -> web.Response:
    body = error_object(job)
    return reply(body, HTTP_STATUS.get(body["error"].get("code"), 500))


def sse(item: Any) -> str:
    """A stream item as SSE text: worker-vllm's raw text as it is, chunk lists (RAW_OPENAI_OUTPUT
    false) one event per chunk."""
    if isinstance(item, str):
        return item
    chunks = item if isinstance(item, list) else [item]
    return "".join(f"data: {dumps(c)}\n\n" for c in chunks)


async def stream_reply(endpoint: JobEndpoint, job: Job, request: web.Request) -> web.StreamResponse:
    """The job's items as server-sent events while they come; a failure before the first item
    answers an HTTP error instead."""
    while not job.stream and job.status not in FINAL:
        await endpoint.wait_change(job)
    if job.status != COMPLETED and not job.stream:
        return error_reply(job)
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
    await response.prepare(request)
    sent, done = 0, False
    try:
        while True:
            new = job.stream[sent:]
            sent += len(new)
            for item in new:
                text = sse(item)
                done = done or text.rstrip().endswith("data: [DONE]")
                await response.write(text.encode("utf-8"))
            if job.status in FINAL and sent == len(job.stream):
                break
            if sent == len(job.stream):
                await endpoint.wait_change(job)
        if job.status != COMPLETED:
            await response.write(f"data: {dumps(error_object(job))}\n\n".encode("utf-8"))
        if not done:
            await response.write(DONE.encode("utf-8"))
        await response.write_eof()
    except (ConnectionResetError, ConnectionError):
        log.info("[job %s] the client went away: cancelling the job", job.id)
        endpoint.cancel(job)
    return response


def openai_routes(endpoint: JobEndpoint, base: str = ENDPOINT + "/openai/v1",
                  max_body: int = MAX_RUNSYNC_BODY) -> list[web.RouteDef]:
    """The OpenAI routes of `endpoint` under `base` (RunPod's /v2/{endpoint_id}/openai/v1; a
    load-balancing worker's /v1), bodies up to max_body bytes."""

    timeout = body_timeout(endpoint)

    async def run(request: web.Request, route: str, sized: tuple[Any, int] | None) -> web.StreamResponse:
        body, size = sized or (None, 0)
        job_input = {"openai_route": route} if body is None else {"openai_route": route, "openai_input": body}
        job = endpoint.submit(job_input, sync=True, size=size)
        if isinstance(body, dict) and body.get("stream") is True:
            return await stream_reply(endpoint, job, request)
        await endpoint.wait_final(job)
        if job.status != COMPLETED:
            return error_reply(job)
        return reply(job.output[-1] if len(job.output) == 1 else job.output)

    async def chat(request: web.Request) -> web.StreamResponse:
        return await run(request, "/v1/chat/completions", await read_json(request, max_body, timeout))

    async def completions(request: web.Request) -> web.StreamResponse:
        return await run(request, "/v1/completions", await read_json(request, max_body, timeout))

    async def responses(request: web.Request) -> web.StreamResponse:
        return await run(request, "/v1/responses", await read_json(request, max_body, timeout))

    async def models(request: web.Request) -> web.StreamResponse:
        return await run(request, "/v1/models", None)

    return [
        web.post(base + "/chat/completions", chat),
        web.post(base + "/completions", completions),
        web.post(base + "/responses", responses),
        web.get(base + "/models", models),
    ]
