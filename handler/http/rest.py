"""RunPod's serverless REST API under /v2/{endpoint_id} (any id): POST /run and /runsync,
/status/{id}, /stream/{id}, POST /cancel/{id}, GET /health, with RunPod's answers: ids,
states, delayTime and executionTime in ms, `{"error": "request does not exist"}` (404) for
an id that is unknown or past its retention, /runsync's `?wait=` (ms, 1000-300000, default
90000) after which it answers the job's state for the client to poll."""
from __future__ import annotations

import asyncio
import functools
import json
import logging
from typing import Any

from aiohttp import web

from handler.http.endpoint import JobEndpoint, LocalEndpoint
from handler.http.jobs import IN_QUEUE, NOT_FOUND

log = logging.getLogger("handler.http")

MAX_RUN_BODY = 10 * 1024 * 1024  # RunPod's payload limits: /run
MAX_RUNSYNC_BODY = 20 * 1024 * 1024  # ... /runsync
RUNSYNC_WAIT_MS = (1000, 90_000, 300_000)  # /runsync ?wait=: least, default, most
ENDPOINT = "/v2/{endpoint_id}"

dumps = functools.partial(json.dumps, ensure_ascii=False)


def reply(payload: Any, status: int = 200) -> web.Response:
    return web.json_response(payload, status=status, dumps=dumps)


def error(status: int, message: str) -> web.Response:
    return reply({"error": message}, status)


DEFAULT_BODY_TIMEOUT_S = 30.0


async def read_json(request: web.Request, limit: int, timeout: float = DEFAULT_BODY_TIMEOUT_S) -> tuple[Any, int]:
    """The request's JSON body and its size in bytes (a bad one, or one slower than `timeout`
    seconds to arrive: web.HTTPException with RunPod's `{"error"}` body)."""
    try:
        body = await asyncio.wait_for(request.read(), timeout)
    except TimeoutError:
        raise web.HTTPRequestTimeout(text=dumps({"error": f"the request's body did not arrive within {timeout:g}s "
                                                          "(SERVE_BODY_TIMEOUT_S)"}),
                                     content_type="application/json", headers={"Connection": "close"}) from None
    if len(body) > limit:
        raise web.HTTPRequestEntityTooLarge(max_size=limit, actual_size=len(body), text=dumps(
            {"error": f"payload too large ({limit // (1024 * 1024)} MB at most)"}), content_type="application/json")
    try:
        return json.loads(body or b"{}"), len(body)
    except (ValueError, RecursionError) as exc:
        raise web.HTTPBadRequest(text=dumps({"error": f"the body is not JSON: {exc}"}),
                                 content_type="application/json") from None


def body_timeout(endpoint: JobEndpoint) -> float:
    """SERVE_BODY_TIMEOUT_S of the endpoint's worker."""
    return getattr(endpoint.worker.settings, "serve_body_timeout_s", None) or DEFAULT_BODY_TIMEOUT_S


async def job_input(request: web.Request, limit: int, timeout: float) -> tuple[Any, int]:
    """The body's `input` and the body's size in bytes."""
    payload, size = await read_json(request, limit, timeout)
    if not isinstance(payload, dict) or "input" not in payload:
        raise web.HTTPBadRequest(text=dumps({"error": 'the body must be a JSON object with "input"'}),
                                 content_type="application/json")
    for key in ("webhook", "policy", "s3Config"):
        if key in payload:
            log.warning("%s is not supported by the local endpoint and was ignored", key)
    return payload["input"], size


def runsync_wait_s(request: web.Request) -> float:
    least, default, most = RUNSYNC_WAIT_MS
    raw = request.query.get("wait")
    try:
        wait = default if raw is None else int(raw)
    except ValueError:
        raise web.HTTPBadRequest(text=dumps({"error": "wait must be an integer (milliseconds)"}),
                                 content_type="application/json") from None
    return min(max(wait, least), most) / 1000


def rest_routes(endpoint: LocalEndpoint) -> list[web.RouteDef]:
    """The /v2 routes of `endpoint`."""

    timeout = body_timeout(endpoint)

    async def run(request: web.Request) -> web.Response:
        body, size = await job_input(request, MAX_RUN_BODY, timeout)
        job = endpoint.submit(body, size=size)
        return reply({"id": job.id, "status": IN_QUEUE})

    async def runsync(request: web.Request) -> web.Response:
        wait = runsync_wait_s(request)
        body, size = await job_input(request, MAX_RUNSYNC_BODY, timeout)
        job = endpoint.submit(body, sync=True, size=size)
        await endpoint.wait_final(job, wait)
        return reply(job.view())

    def known(handler):
        @functools.wraps(handler)
        async def with_job(request: web.Request) -> web.Response:
            job = endpoint.get(request.match_info["job_id"])
            return error(404, NOT_FOUND["error"]) if job is None else handler(job)
        return with_job

    status = known(lambda job: reply(job.view()))
    stream = known(lambda job: reply(job.take_stream()))
    cancel = known(lambda job: reply(endpoint.cancel(job)))

    async def health(request: web.Request) -> web.Response:
        return reply(endpoint.health())

    return [
        web.post(ENDPOINT + "/run", run),
        web.post(ENDPOINT + "/runsync", runsync),
        web.get(ENDPOINT + "/status/{job_id}", status),
        web.post(ENDPOINT + "/status/{job_id}", status),
        web.get(ENDPOINT + "/stream/{job_id}", stream),
        web.post(ENDPOINT + "/stream/{job_id}", stream),
        web.post(ENDPOINT + "/cancel/{job_id}", cancel),
        web.get(ENDPOINT + "/health", health),
    ]
