"""A load-balancing worker's HTTP apps (aiohttp): the API on PORT, the local endpoint's OpenAI
routes under /v1 (streamed as server-sent events as there) and POST /runsync (a job's
`{"input"}`, answered when it ends with RunPod's /runsync object: id, status, output or error),
and `GET /ping` on PORT_HEALTH, for RunPod's load balancer: 204 while the model loads, 200
ready, 503 when the load failed, the engine is dead or the worker stops. Every refusal is a coded
error object (`{"error": {"code", "message", "retryable", "type", "param"}}`): 429 with
Retry-After past the worker's concurrency, 503 while it stops, 4xx naming what is wrong."""
from __future__ import annotations

import json

from aiohttp import web

from handler.errors import JobError
from handler.http.jobs import COMPLETED
from handler.http.lb_endpoint import BalancedEndpoint, Refused
from handler.http.openai_routes import HTTP_STATUS, error_object, openai_error, openai_routes
from handler.http.rest import body_timeout, job_input, reply
from handler.http.server import quiet_malformed_requests

BODY_STATUSES = (400, 408, 413)  # refusals of the request's body (not JSON, too slow, too large)
# RunPod's load balancer passes bodies of up to 30 MB (docs.runpod.io, load-balancing endpoints'
# payload limits); a larger one gets a coded 413
MAX_LB_BODY = 30 * 1024 * 1024


def coded(status: int, error: JobError, headers: dict[str, str] | None = None) -> web.Response:
    response = reply(openai_error(error.to_dict()), status)
    response.headers.update(headers or {})
    return response


@web.middleware
async def coded_errors(request: web.Request, handler):
    """Refusals and aiohttp's own errors (an unknown route, a bad body) as coded error objects."""
    try:
        return await handler(request)
    except Refused as exc:
        return coded(exc.status, exc.error, exc.headers)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = f"{exc.reason}: {request.method} {request.path}"
        if exc.status == 413:  # aiohttp's own refusal of a body past client_max_size
            message = f"payload too large ({MAX_LB_BODY >> 20} MB at most): {request.method} {request.path}"
        if exc.content_type == "application/json":  # handler.http.rest's `{"error": "..."}`
            try:
                message = json.loads(exc.text)["error"]
            except (ValueError, KeyError, TypeError):
                pass
        field = "body" if exc.status in BODY_STATUSES else None
        code = "invalid_input" if exc.status < 500 else "internal_error"
        return coded(exc.status, JobError(code, message, retryable=False, field=field),
                     {"Connection": "close"} if exc.status == 408 else None)


def ping_status(endpoint: BalancedEndpoint) -> int:
    """What /ping answers: 204 loading, 200 ready, 503 unhealthy or stopping."""
    worker = endpoint.worker
    if endpoint.stopping or worker.dead is not None or worker.loader.failed:
        return 503
    return 200 if worker.engine is not None else 204


def ping_routes(endpoint: BalancedEndpoint) -> list[web.RouteDef]:
    async def ping(request: web.Request) -> web.Response:
        status = ping_status(endpoint)
        if status == 204:
            return web.Response(status=204)
        return reply({"status": "healthy" if status == 200 else "unhealthy"}, status)

    return [web.get("/ping", ping)]


def runsync_routes(endpoint: BalancedEndpoint) -> list[web.RouteDef]:
    timeout = body_timeout(endpoint)

    async def runsync(request: web.Request) -> web.Response:
        body, size = await job_input(request, MAX_LB_BODY, timeout)
        job = endpoint.submit(body, size=size)
        await endpoint.wait_final(job)
        if job.status == COMPLETED:
            return reply(job.view())
        return reply(job.view(), HTTP_STATUS.get(error_object(job)["error"].get("code"), 500))

    return [web.post("/runsync", runsync)]


def make_api_app(endpoint: BalancedEndpoint, *, with_ping: bool = True) -> web.Application:
    """The app on PORT (with /ping when PORT_HEALTH is the same port)."""
    quiet_malformed_requests()
    app = web.Application(client_max_size=MAX_LB_BODY + 1024 * 1024, middlewares=[coded_errors])
    routes = openai_routes(endpoint, "/v1", MAX_LB_BODY) + runsync_routes(endpoint)
    app.add_routes(routes + (ping_routes(endpoint) if with_ping else []))
    return app


def make_health_app(endpoint: BalancedEndpoint) -> web.Application:
    """The app on a PORT_HEALTH of its own: /ping only."""
    app = web.Application(middlewares=[coded_errors])
    app.add_routes(ping_routes(endpoint))
    return app
